/* core/dist_zero.c - ZeRO-1 ([dist] zero = 1, docs/distributed.md): the
 * optimizer state sharded across the ranks, gradients reduce-scattered
 * during backward, each rank stepping its slice of the parameters with the
 * [train] optimizer (any optimizer whose kiln_optim_info.shard is
 * KILN_OPTIM_SHARD_SLICE, plugins included) and the slices allgathered
 * before the next forward reads them. */
#include "dist_impl.h"
#include "checkpoint.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

/* ---- ZeRO-1 ---------------------------------------------------------------
 * The trainable range [0, n) is cut into buckets of whole units of
 * 16*world floats covering [0, zwc) (of about [dist] bucket_mb, cut from
 * the end like DDP's, without regard to tensor boundaries) and the
 * replicated tail [zwc, n), zt = n - zwc < 16*world floats.  Rank r
 * owns piece r of every bucket: the c = (hi - lo) / world floats from
 * lo + r*c (lo and c multiples of 16: 64-byte aligned), kept at zoff in
 * its compact shard, zc floats in all.  During
 * backward each bucket's gradients are reduce-scattered (average) in
 * place, into this rank's piece of the gradients (comm ops version 9's
 * reduce_scatter_in_place; zgrad, a buffer of their own, with an older
 * communicator or a pipeline) as soon as they are final (the same hook and comm stream as DDP's
 * allreduces); the tail is allreduced after backward.  Each rank updates
 * its pieces of the parameters (and the tail, identically on every rank)
 * with the fused optimizer op over each piece and its own slice of the
 * state, then every bucket's pieces are allgathered in place.  The
 * optimizer state held is (zc + zt) floats a slot instead of n.
 * Checkpoints hold the state whole, so their files do not depend on
 * the world size: rank 0 writes each slot as it is allgathered through
 * the gradient buffer (kiln_dist_zero_save; with a pipeline the state is
 * gathered whole first, kiln_dist_zero_gather).  When a clip op runs
 * (GRAD_CLIP or UNSCALE: [train] clip_norm, clip_value, skip_nonfinite,
 * loss scaling) the averaged pieces are allgathered back into the
 * gradient buffer first, so the norm and the finite flag are the global
 * ones and identical on every rank. */

/* What ZeRO-1 shards and over whom: the whole trainable range over the
 * world, or with [dist] pipeline this stage's slice [lo, hi) over its D
 * ranks (the stage group, gctx). */
static void zero_span(const struct kiln_dist *d, size_t *lo, size_t *hi)
{
	*lo = d->pipe_P ? d->pipe_lo[d->pipe_stage] : 0;
	*hi = d->pipe_P ? d->pipe_hi[d->pipe_stage] : d->m->n_trainable;
	if (*hi < *lo)
		*hi = *lo;
}

static size_t zero_rank(const struct kiln_dist *d)
{
	return (size_t)(d->pipe_P ? d->env.rank / d->pipe_P : d->env.rank);
}

static size_t zero_world(const struct kiln_dist *d)
{
	return (size_t)(d->pipe_P ? d->pipe_D : d->env.world);
}

void *dist_zero_comm(const struct kiln_dist *d)
{
	return d->gctx ? d->gctx : d->ctx;
}

size_t kiln_dist_zero_tail(size_t n, size_t world)
{
	return n % (16 * world);
}

float *dist_zero_piece(const struct kiln_dist *d, const struct bucket *b)
{
	return d->zgrad ? d->zgrad + b->zoff : d->m->grads_d + b->lo + zero_rank(d) * b->c;
}

static kiln_status zero_plan(struct kiln_dist *d, size_t len, void **plan)
{
	return kiln_model_optim_plan(d->m, len, plan);
}

/* ZeRO-1's buckets in place of DDP's, with their pieces and plans */
static kiln_status zero_buckets(struct kiln_dist *d)
{
	struct kiln_model *m = d->m;
	size_t lo0, n;
	zero_span(d, &lo0, &n);
	const size_t W = zero_world(d), u = 16 * W;
	size_t cap = (size_t)(d->bucket_mb * 1048576.0 / sizeof(float)) / u * u;
	kiln_status st;
	if (cap < u)
		cap = u;
	dist_free_buckets(d);
	d->zt = kiln_dist_zero_tail(n - lo0, W);
	d->zwc = n - d->zt;
	d->zc = 0;
	const size_t nb = (d->zwc - lo0 + cap - 1) / cap;
	if (!(d->b = calloc(nb ? nb : 1, sizeof *d->b)))
		return kiln_error(KILN_ENOMEM, "out of memory");
	for (size_t hi = d->zwc; hi > lo0; d->n_b++) {
		struct bucket *b = &d->b[d->n_b];
		b->hi = hi;
		b->lo = hi - lo0 > cap ? hi - cap : lo0;
		b->c = (b->hi - b->lo) / W;
		b->zoff = d->zc;
		d->zc += b->c;
		/* final after the backward of the first layer with a tensor
		 * in it (-1: padding only, started after backward) */
		b->ready_layer = -1;
		for (int i = 0; i < m->n_params; i++) {
			const struct model_param *p = &m->params[i];
			if (p->trainable && !p->buffer && p->off < b->hi &&
			    p->off + (size_t)p->numel > b->lo &&
			    (b->ready_layer < 0 || p->grad_layer < b->ready_layer))
				b->ready_layer = p->grad_layer;
		}
		/* the next forward needs the bucket's parameters whole before
		 * the first layer that reads one of them (a tied weight's
		 * readers included) */
		b->need_layer = m->n_layers;
		for (int l = 0; l < m->n_layers && b->need_layer == m->n_layers; l++)
			for (int k = 0; k < m->layers[l].n_params; k++) {
				const struct model_param *p = &m->params[m->layers[l].pidx[k]];
				if (!p->buffer && p->off < b->hi && p->off + (size_t)p->numel > b->lo)
					b->need_layer = l;
			}
		b->s0 = (struct stamp){ d, d->n_b, 0 };
		b->s1 = (struct stamp){ d, d->n_b, 1 };
		b->sg = (struct stamp){ d, d->n_b, 2 };
		b->sw = (struct stamp){ d, d->n_b, 0 };
		/* (a failure counts this bucket in, so dist_free_buckets
		 * releases what it has) */
		if ((st = kiln_device_event_create(d->dev, &b->done)) ||
		    (st = kiln_device_event_create(d->dev, &b->gdone))) {
			d->n_b++;
			return st;
		}
		for (int k = 0; k < d->n_b && !b->plan; k++)
			if (d->b[k].c == b->c)
				b->plan = d->b[k].plan;
		if (!b->plan) {
			if ((st = zero_plan(d, b->c, &b->plan))) {
				d->n_b++;
				return st;
			}
			b->own_plan = 1;
		}
		hi = b->lo;
	}
	if ((d->zt && (st = zero_plan(d, d->zt, &d->ztplan))) ||
	    (st = kiln_device_event_create(d->dev, &d->zt_done)))
		return st;
	return KILN_OK;
}

static kiln_status fwd_hook(void *user, int layer, void *stream);

/* This rank's pieces of one optimizer slot, from `whole` (n_trainable
 * floats, the model's layout) into its shard `dst` (zc + zt floats). */
static kiln_status zero_keep_pieces(struct kiln_dist *d, const float *whole, float *dst,
				    void *compute)
{
	const size_t r = zero_rank(d);
	kiln_status st;
	for (int i = 0; i < d->n_b; i++) {
		const struct bucket *b = &d->b[i];
		if ((st = kiln_device_copy_async(d->dev, dst + b->zoff, whole + b->lo + r * b->c,
						 b->c * sizeof(float), KILN_COPY_D2D, compute)))
			return st;
	}
	return d->zt ? kiln_device_copy_async(d->dev, dst + d->zc, whole + d->zwc,
					      d->zt * sizeof(float), KILN_COPY_D2D, compute)
		     : KILN_OK;
}

/* The shard of a model made without its whole state
 * (kiln_model_create_sharded): zeros, or, resuming from `file` (rank 0's
 * newest checkpoint; `given`: this rank's open one, else opened here),
 * each slot read whole by rank 0 into the gradient buffer (zero before
 * the first step, and as long as a slot), broadcast, every rank keeping
 * its pieces; with [dist] pipeline every rank reads its stage's slice of
 * the slot itself (as kiln_dist_pipe_resume: its gradients may be the
 * stage's alone); the gradients zeroed again after. */
static kiln_status zero_state_read(struct kiln_dist *d, const char *file, struct kiln_ckpt *given,
				   void *compute)
{
	struct kiln_model *m = d->m;
	const size_t n = m->n_trainable, L = d->zc + d->zt;
	struct kiln_ckpt *ck = given;
	kiln_status st = KILN_OK;
	size_t lo, hi, *lay = NULL;
	zero_span(d, &lo, &hi);
	if (!file || !*file)
		return kiln_dist_pipe_zero(d, d->zstate, (size_t)m->state_slots * L, compute);
	for (int s = 0; s < m->state_slots && !st; s++) {
		double failed = 0;
		if (d->pipe_P || !d->env.rank) {
			/* (its tensors' layout checked once, for every slot) */
			st = ck ? KILN_OK : kiln_ckpt_open(file, &ck);
			if (!st && !s)
				st = kiln_ckpt_slot_layout(ck, m, &lay);
			if (!st)
				st = kiln_ckpt_load_slot(ck, m, lay, s, lo, hi, m->grads_d + lo, compute);
			failed = st != KILN_OK;
		}
		/* every rank learns whether the readers read it: none waits in
		 * a broadcast rank 0 never starts */
		kiln_status st2 = kiln_dist_sum_host(d, &failed, 1, compute);
		if (st || (st = st2))
			break;
		if (failed > 0) {
			st = kiln_error(KILN_EDATA, "rank %d of %d: %s could not read the optimizer state of %s (its message says why)",
					d->env.rank, d->env.world, d->pipe_P ? "another rank" : "rank 0", file);
			break;
		}
		if ((!d->pipe_P && (st = d->ops->broadcast(d->ctx, m->grads_d, n, KILN_F32, 0, compute, NULL))) ||
		    (L && (st = zero_keep_pieces(d, m->grads_d, d->zstate + (size_t)s * L, compute))) ||
		    (st = kiln_device_stream_sync(d->dev, compute)))
			st = kiln_dist_explain(d, st);
	}
	if (ck != given)
		kiln_ckpt_close(ck);
	free(lay);
	if (st)
		return kiln_error_wrap(st, "ZeRO-1: resuming the optimizer state from %s", file);
	return kiln_dist_pipe_zero(d, m->grads_d + lo, hi - lo, compute);
}

kiln_status kiln_dist_zero_init(struct kiln_dist *d, void *compute, int clip, const char *file,
				 struct kiln_ckpt *ck)
{
	kiln_status st;
	if (!d || !d->zero)
		return KILN_OK;
	struct kiln_model *m = d->m;
	const size_t n = m->n_trainable;
	size_t lo0, hi0;
	zero_span(d, &lo0, &hi0);
	if (m->optim_info.shard == KILN_OPTIM_SHARD_NONE)
		return kiln_error(KILN_ECONFIG, "%s: [dist] zero = 1 with [train] optimizer = %s: its update reads whole tensors (LAMB's trust ratio), and ZeRO-1's shards cut tensors; use an optimizer that shards (sgd, adam, adamw), or zero = 0",
				  kiln_config_where(m->cfg, "dist", "zero"), m->optim_name);
	if (!d->ops->reduce_scatter || !d->ops->allgather)
		return kiln_error(KILN_EPLUGIN, "%s: [dist] zero = 1: comm plugin '%s' has no reduce_scatter or allgather",
				  kiln_config_where(m->cfg, "dist", "zero"), d->plugin->name);
	d->zero_gather = clip;
	if ((st = zero_buckets(d)))
		return kiln_error_wrap(st, "ZeRO-1: the optimizer over a shard");
	const size_t L = d->zc + d->zt, slots = (size_t)m->state_slots;
	/* (the averaged pieces in place in the gradients where the
	 * communicator can: dist_zero_piece) */
	const int in_place = dist_rs_in_place(d->ops);
	if (slots && L && (st = kiln_device_alloc(d->dev, slots * L * sizeof(float), (void **)&d->zstate)))
		return kiln_model_alloc_failed(m, st, "optimizer state for this rank's ZeRO-1 shard",
					       slots * L * sizeof(float), slots * L);
	if (d->zc && !in_place &&
	    (st = kiln_device_alloc(d->dev, d->zc * sizeof(float), (void **)&d->zgrad)))
		return kiln_model_alloc_failed(m, st, "averaged gradients for this rank's ZeRO-1 shard",
					       d->zc * sizeof(float), d->zc);
	/* this rank's pieces: of the (broadcast) whole state, which is then
	 * freed ([dist] pipeline's model holds it), or made here */
	for (size_t s = 0; s < slots && m->state_d && L; s++)
		if ((st = zero_keep_pieces(d, m->state_d + s * n, d->zstate + s * L, compute)))
			return st;
	/* every rank, its shard empty or not: the read's sums and broadcasts
	 * are collectives (an empty one skipped them: the others waited for
	 * it until [dist] timeout) */
	if (slots && !m->state_d && (st = zero_state_read(d, file, ck, compute)))
		return st;
	if ((st = dist_drop_whole_state(d, compute)))
		return st;
	d->s_read.d = d;
	m->fwd_hook = fwd_hook;
	m->fwd_user = d;
	kiln_log(KILN_LOG_INFO, "dist", "ZeRO-1: rank %d updates %zu floats, 1/%zu of each of %d gradient bucket(s) over [%zu, %zu), and the replicated tail [%zu, %zu); optimizer state %.2f MiB instead of %.2f MiB; gradients reduce-scattered %s backward, %s%s; parameters allgathered %s",
		 d->env.rank, d->zc, zero_world(d), d->n_b, lo0, d->zwc, d->zwc, hi0,
		 (double)(slots * L * sizeof(float)) / 1048576.0,
		 (double)(slots * n * sizeof(float)) / 1048576.0,
		 d->overlap ? "overlapped with" : "after",
		 d->zgrad || !d->zc ? "the pieces into a buffer of their own" : "in place",
		 clip ? ", then gathered whole for the clip / non-finite check" : "",
		 d->overlap ? "on the comm stream, overlapped with the next forward"
			    : "after the optimizer, before the next forward");
	return KILN_OK;
}

int kiln_dist_zero(const struct kiln_dist *d)
{
	return d && d->zero;
}

/* the optimizer over [lo, ...) of the flat parameters, its state at st0 */
static kiln_status zero_run(struct kiln_dist *d, void *plan, const float *grads, size_t lo,
			    float *st0, const float *lr, void *compute)
{
	return kiln_model_optim_run(d->m, plan, grads, lo, st0, d->zc + d->zt, lr, compute);
}

/* [dist] timing's host functions for the parameter allgathers (their
 * ends: dist_stamp_bucket): the first reader's start (compute), and, once the
 * compute stream waited for bucket b, whether it ended after that start */
static kiln_status stamp_read(void *arg)
{
	struct stamp *s = arg;
	s->d->t_read = kiln_now_s();
	return KILN_OK;
}

static kiln_status stamp_waited(void *arg)
{
	struct stamp *s = arg;
	s->d->glate += s->d->b[s->b].tg > s->d->t_read;
	s->d->gruns++;
	return KILN_OK;
}

/* Make `stream` wait for the parameter allgather of every pending bucket
 * the forward of layers [0, layer] reads (layer >= n_layers: all of
 * them).  No-op when none is pending: only the first reader after a
 * ZeRO-1 step waits. */
static kiln_status zero_wait_params(struct kiln_dist *d, int layer, void *stream)
{
	kiln_status st;
	int left = 0;
	if (!d->zpending)
		return KILN_OK;
	if (d->timing && !d->read_stamped) {
		if ((st = kiln_device_host_fn(d->dev, stream, stamp_read, &d->s_read)))
			return st;
		d->read_stamped = 1;
	}
	for (int i = d->n_b - 1; i >= 0; i--) {
		struct bucket *b = &d->b[i];
		if (!b->gpending)
			continue;
		if (b->need_layer > layer) {
			left = 1;
			continue;
		}
		if ((st = kiln_device_stream_wait(d->dev, stream, b->gdone)) ||
		    (d->timing && (st = kiln_device_host_fn(d->dev, stream, stamp_waited, &b->sw))))
			return st;
		b->gpending = 0;
	}
	d->zpending = left;
	return KILN_OK;
}

static kiln_status fwd_hook(void *user, int layer, void *stream)
{
	return zero_wait_params(user, layer, stream);
}

kiln_status kiln_dist_zero_settle(struct kiln_dist *d, void *stream)
{
	return d && d->zero ? zero_wait_params(d, INT_MAX, stream) : KILN_OK;
}

/* Every bucket's pieces, from this rank's compact `mine` (zoff) into the
 * whole `full` (lo), or in place (mine NULL), on `stream`, the buckets
 * the first layers read first.  `params`: the parameters after a step
 * (and their low-precision compute copy, when there is one); each bucket
 * then records its gdone and is pending for the next forward
 * (zero_wait_params). */
kiln_status dist_zero_allgather(struct kiln_dist *d, const float *mine, float *full, void *stream,
				 int params)
{
	const struct kiln_model *m = d->m;
	const size_t r = zero_rank(d);
	const int lp = params && m->params_c;
	const size_t cs = lp ? kiln_dtype_size(m->cdtype) : 0;
	kiln_status st;
	for (int i = d->n_b - 1; i >= 0; i--) {
		struct bucket *b = &d->b[i];
		void *done = params && !d->timing ? b->gdone : NULL;
		char *pc = lp ? (char *)m->params_c + b->lo * cs : NULL;
		if ((st = d->ops->allgather(dist_zero_comm(d), mine ? mine + b->zoff : full + b->lo + r * b->c,
					    full + b->lo, b->c, KILN_F32, stream, lp ? NULL : done)) ||
		    (lp && (st = d->ops->allgather(dist_zero_comm(d), pc + r * b->c * cs, pc, b->c, m->cdtype,
						   stream, done))))
			return st;
		if (params && d->timing &&
		    ((st = kiln_device_host_fn(d->dev, stream, dist_stamp_bucket, &b->sg)) ||
		     (st = kiln_device_event_record(d->dev, b->gdone, stream))))
			return st;
		b->gpending |= params;
	}
	if (params) {
		d->zpending = d->n_b > 0;
		d->read_stamped = 0;
	}
	return KILN_OK;
}

kiln_status kiln_dist_zero_step(struct kiln_dist *d, const float *lr, void *compute)
{
	struct kiln_model *m = d->m;
	kiln_status st;
	const size_t r = zero_rank(d);
	if (!m->n_trainable)
		return KILN_OK;
	/* the previous step's allgathers write the parameters this one
	 * updates (the forward waited for them all unless it skipped a
	 * layer) */
	if ((st = zero_wait_params(d, INT_MAX, compute)))
		return st;
	/* advance first (gated like the step: a skipped step is not counted):
	 * the op reads the (1-based) number of the step it takes */
	if ((st = kiln_model_opt_step_advance(m, compute)))
		return st;
	/* each piece reads the gradients the clip saw (whole, gathered back)
	 * or its own averaged piece */
	for (int i = 0; i < d->n_b; i++) {
		const struct bucket *b = &d->b[i];
		const size_t lo = b->lo + r * b->c;
		if ((st = zero_run(d, b->plan, d->zero_gather ? m->grads_d + lo : dist_zero_piece(d, b),
				   lo, d->zstate ? d->zstate + b->zoff : NULL, lr, compute)))
			return st;
	}
	if (d->zt && (st = zero_run(d, d->ztplan, m->grads_d + d->zwc, d->zwc,
				    d->zstate ? d->zstate + d->zc : NULL, lr, compute)))
		return st;
	/* every rank's updated pieces, in place: with overlap on the comm
	 * stream once the update is done, while the compute stream goes on
	 * to the next forward, whose layers wait for their buckets (fwd_hook);
	 * without, on the compute stream before it */
	void *s = compute;
	if (d->overlap && d->n_b) { /* (no buckets: nothing to gather) */
		if ((st = kiln_device_event_record(d->dev, d->ready, compute)) ||
		    (st = kiln_device_stream_wait(d->dev, d->comm_stream, d->ready)))
			return st;
		s = d->comm_stream;
	}
	return dist_zero_allgather(d, NULL, m->params_d, s, 1);
}

/* Slot k of this rank's ZeRO-1 group's state whole into `full` (the
 * whole model's layout: with [dist] pipeline only this stage's slice of
 * it is written), on `compute`: every piece allgathered, the replicated
 * tail copied. */
kiln_status dist_zero_gather_slot(struct kiln_dist *d, int k, float *full, void *compute)
{
	const size_t L = d->zc + d->zt;
	const float *mine = d->zstate + (size_t)k * L;
	kiln_status st = dist_zero_allgather(d, mine, full, compute, 0);
	if (!st && d->zt)
		st = kiln_device_copy_async(d->dev, full + d->zwc, mine + d->zc, d->zt * sizeof(float),
					    KILN_COPY_D2D, compute);
	return st;
}

kiln_status kiln_dist_zero_prepare(struct kiln_dist *d)
{
	kiln_status st;
	/* (with [dist] pipeline rank 0 alone, which writes the file: the
	 * other ranks gather their stage's state a slot at a time through
	 * their gradients, kiln_dist_pipe_gather_state) */
	if (!d || !d->zero || !d->zstate || d->zfull || kiln_dist_zero_streams(d) || d->env.rank)
		return KILN_OK;
	const size_t bytes = (size_t)d->m->state_slots * d->m->n_trainable * sizeof(float);
	if (kiln_dist_ckpt_fault(d, "gather"))
		st = kiln_error(KILN_ENOMEM, "out of device memory (the tests' fault: KILN_TEST_CKPT_FAIL=gather)");
	else
		st = kiln_device_alloc(d->dev, bytes, (void **)&d->zfull);
	return st ? kiln_error_wrap(st, "ZeRO-1: the whole optimizer state's %zu bytes for a checkpoint",
				    bytes)
		  : st;
}

kiln_status kiln_dist_zero_gather(struct kiln_dist *d, void *compute)
{
	kiln_status st;
	if (!d || (!d->zero && !d->pipe_P))
		return KILN_OK;
	/* the checkpoint reads the parameters whole, and no collective runs
	 * on the compute stream while the comm stream's do */
	if (d->zero && (st = zero_wait_params(d, INT_MAX, compute)))
		return st;
	/* [dist] pipeline: every stage's state to rank 0 (dist_pipe.c); else
	 * kiln_dist_zero_save gathers a slot at a time */
	return d->pipe_P ? kiln_dist_pipe_gather_state(d, compute) : KILN_OK;
}

void kiln_dist_zero_release(struct kiln_dist *d)
{
	if (!d || !d->zfull)
		return;
	if (d->m && d->m->state_d == d->zfull)
		d->m->state_d = NULL;
	kiln_device_free(d->dev, d->zfull);
	d->zfull = NULL;
}

/* ---- checkpoints without the whole state ----------------------------------
 * A model made without its whole state (kiln_model_create_sharded: no
 * [dist] pipeline) never gathers it: rank 0 writes the file's optimizer
 * slots one at a time from the gradient buffer (dead between optimizer
 * steps, as long as a slot, zeroed again after), into which every rank's
 * pieces of a slot are allgathered just before rank 0's write reaches it
 * (the source's read).  Every rank runs every slot's allgather, rank 0
 * those its write did not reach (it failed, or never began) after it, so
 * that no rank waits in a collective another skips; then the ranks agree
 * on the allgathers' outcome, rank 0 before its write goes past the last
 * slot, so that a failure on another rank leaves no file. */
struct zero_src {
	struct kiln_dist *d;
	void *compute;
	int next;       /* the slots allgathered so far */
	int agreed;     /* zero_gather_all's agreement taken */
	kiln_status st; /* the first failure's */
};

int kiln_dist_zero_streams(const struct kiln_dist *d)
{
	return d && d->zero && d->m && d->m->state_sharded && !d->pipe_P;
}

/* Slots [z->next, k] allgathered whole into the gradient buffer, in order
 * (each over the last), whatever failed before: the first failure's
 * status. */
static kiln_status zero_gather_slots(struct zero_src *z, int k)
{
	struct kiln_dist *d = z->d;
	struct kiln_model *m = d->m;
	for (; z->next <= k && d->zstate; z->next++) {
		kiln_status st = dist_zero_gather_slot(d, z->next, m->grads_d, z->compute);
		if (!st && (st = kiln_device_stream_sync(d->dev, z->compute)))
			st = kiln_dist_explain(d, st);
		if (!st && kiln_dist_ckpt_fault(d, "gather"))
			st = kiln_error(KILN_EDEVICE, "failed (the tests' fault: KILN_TEST_CKPT_FAIL=%s)",
					getenv("KILN_TEST_CKPT_FAIL"));
		if (st && !z->st)
			z->st = kiln_error_wrap(st, "ZeRO-1: allgathering the optimizer state's '%s' for a checkpoint",
						m->optim_info.slot_names[z->next]);
	}
	return z->st;
}

/* Every slot allgathered, then (once) every rank's outcome summed: rank
 * 0 fails when another rank did (its write must not stand), another rank
 * with its own failure alone (kiln_dist_ckpt_agree tells it rank 0's). */
static kiln_status zero_gather_all(struct zero_src *z)
{
	kiln_status st = zero_gather_slots(z, z->d->m->state_slots - 1), st2;
	double failed = st != KILN_OK;
	if (z->agreed)
		return st;
	z->agreed = 1;
	if ((st2 = kiln_dist_sum_host(z->d, &failed, 1, z->compute)) && !st)
		st = z->st = st2;
	else if (!st && failed > 0 && !z->d->env.rank)
		st = z->st = kiln_error(KILN_EIO, "not written: %g other rank(s) failed (their messages say why)",
					failed);
	return st;
}

static int zero_owns(void *ctx, const char *tag)
{
	(void)ctx, (void)tag;
	return 0; /* (the slots alone, which the model does not list) */
}

/* rank 0's write: bytes [off, off + n) of slot `tag` */
static kiln_status zero_read(void *ctx, const char *tag, size_t off, void *host, size_t n)
{
	struct zero_src *z = ctx;
	struct kiln_model *m = z->d->m;
	int k = 0;
	while (k < m->state_slots && strcmp(m->optim_info.slot_names[k], tag))
		k++;
	if (k == m->state_slots)
		return kiln_error(KILN_EINTERNAL, "ZeRO-1: a checkpoint section '%s' that is no optimizer slot", tag);
	/* (the last slot gathered: the ranks agree before the write ends) */
	kiln_status st = k + 1 < m->state_slots ? zero_gather_slots(z, k) : zero_gather_all(z);
	if (!st)
		st = kiln_device_copy_async(z->d->dev, host, (const char *)m->grads_d + off, n,
					    KILN_COPY_D2H, z->compute);
	return st ? st : kiln_device_stream_sync(z->d->dev, z->compute);
}

kiln_status kiln_dist_zero_save(struct kiln_dist *d, kiln_status st, const char *dir,
				const struct kiln_ckpt_meta *meta, void *compute, char *path,
				size_t path_len)
{
	struct kiln_model *m = d->m;
	struct zero_src z = { d, compute, 0, 0, KILN_OK };
	const struct kiln_ckpt_src src = { &z, zero_owns, zero_read,
					   m->n_trainable * sizeof(float) };
	if (!st && !d->env.rank)
		st = kiln_ckpt_save_src(dir, meta, m, compute, &src, path, path_len);
	kiln_status st2 = zero_gather_all(&z);
	kiln_status st3 = kiln_dist_pipe_zero(d, m->grads_d, m->n_trainable, compute);
	return st ? st : st2 ? st2 : st3;
}
