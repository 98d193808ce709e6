/* core/pipe_window.c - a pipeline's crossing tensors in memory its ranks
 * share (docs/pipeline.md, "Hand-offs in place"; [pipeline] zero_copy).
 *
 * With stages on ranks of one node (a communicator with map_shared, comm
 * ops version 8, on a device whose memory is the host's), each shareable
 * crossing tensor (kiln_pipe_xfer_shared) of each activation set has one
 * buffer in memory both its stages' ranks map: the producer's stage writes
 * its output there and the next stage's layers read it there; the later
 * stage writes the tensor's gradient there and the producer's backward
 * reads it there.  The buffers take the place of the storages on both
 * sides (storage.ext: the producer's output storage and the receive buffer
 * for the activation, the gradient's receive buffer and the producer's
 * gradient storage for the gradient), so a hand-off moves no bytes: its
 * message is a token (core/pipe_rank.c), which says only that the buffer
 * is written.
 *
 * Why nothing overwrites a buffer another rank still reads: activation
 * set k is taken again (pipe_run.c's enter) only at stage 0 after its
 * backward of the micro-batch that held it, which comes after the return
 * of that micro-batch's gradient from every later stage, which each sends
 * after its own backward of it, its last read of the activation; and a
 * later stage writes set k's gradient again only in the backward of a
 * micro-batch that entered after that.  The tokens order it, as messages
 * ordered the copies before (so an activation whose gradient is not
 * returned, a frozen stage 0's, is not shared: kiln_pipe_xfer_shared).
 * Only the two storages move (storage.ext): others the planner packed into
 * their arena bytes, at other times of the schedule, stay in the arena. */
#include "pipeline.h"

/* A shared buffer's bytes: its two storages' larger, in cache lines. */
static size_t piece(const struct kiln_plan *p, int a, int b)
{
	size_t n = p->store[a].bytes > p->store[b].bytes ? p->store[a].bytes : p->store[b].bytes;
	return (n + 63) / 64 * 64;
}

/* Both plans' crossing tensors alike (the K plans of one model and batch
 * are; a difference would leave the ranks apart on what is shared). */
static int same_xfers(const struct kiln_plan *a, const struct kiln_plan *b)
{
	if (a->n_xfer != b->n_xfer)
		return 0;
	for (int e = 0; e < a->n_xfer; e++) {
		const struct plan_xfer *x = &a->xfer[e], *y = &b->xfer[e];
		if (x->from != y->from || x->to != y->to || x->src != y->src || x->recv != y->recv ||
		    x->gsrc != y->gsrc || x->grecv != y->grecv || x->gadd != y->gadd)
			return 0;
	}
	return 1;
}

/* The bytes of stage s's slice: its shared buffers of every set (the
 * later stage of each crossing tensor holds it) */
static size_t slice_bytes(struct kiln_plan **plan, int K, int s, const unsigned char *shared)
{
	const struct kiln_plan *p = plan[0];
	size_t n = 0;
	for (int e = 0; e < p->n_xfer; e++) {
		const struct plan_xfer *x = &p->xfer[e];
		if (x->to != s)
			continue;
		if (shared[2 * e])
			n += (size_t)K * piece(p, x->src, x->recv);
		if (shared[2 * e + 1])
			n += (size_t)K * piece(p, x->gsrc, x->grecv);
	}
	return n;
}

kiln_status kiln_pipe_window_open(struct kiln_plan **plan, int K, const struct kiln_comm_ops *ops,
				  void *comm, int P, int mine, const int *rank_of,
				  const int *world_of, unsigned char *shared)
{
	const struct kiln_plan *p = plan[0];
	const int n = p->n_xfer;
	int n_fwd = 0, n_bwd = 0;
	memset(shared, 0, (size_t)(2 * n));
	for (int k = 1; k < K; k++)
		if (!same_xfers(p, plan[k]))
			return kiln_error(KILN_EINTERNAL, "pipeline: activation set %d's crossing tensors differ from set 0's",
					  k);
	for (int e = 0; e < n; e++) {
		int f, b;
		kiln_pipe_xfer_shared(p, e, &f, &b);
		shared[2 * e] = (unsigned char)f, shared[2 * e + 1] = (unsigned char)b;
		n_fwd += f, n_bwd += b;
	}
	size_t bytes = 0;
	for (int s = 0; s < P; s++) {
		const size_t b = slice_bytes(plan, K, s, shared);
		bytes = b > bytes ? b : bytes;
	}
	if (!bytes)
		return KILN_OK;
	void *base[KILN_PIPE_MAX_STAGES];
	kiln_status st = ops->version >= 8 && ops->map_shared
				 ? ops->map_shared(comm, bytes, base)
				 : kiln_error(KILN_ENOTSUP, "the communicator has no map_shared (comm ops version 8)");
	if (st) {
		memset(shared, 0, (size_t)(2 * n));
		if (st != KILN_ENOTSUP)
			return kiln_error_wrap(st, "pipeline: stage %d (rank %d): the crossing tensors' shared memory",
					       mine, world_of[mine]);
		kiln_log(KILN_LOG_INFO, "pipeline", "stage %d (rank %d): crossing tensors sent as messages, not shared: %s",
			 mine, world_of[mine], kiln_last_error());
		return KILN_OK;
	}
	size_t at[KILN_PIPE_MAX_STAGES] = { 0 };
	for (int e = 0; e < n; e++) {
		const struct plan_xfer *x = &p->xfer[e];
		char *slice = base[rank_of[x->to]];
		for (int back = 0; back < 2; back++) {
			if (!shared[2 * e + back])
				continue;
			const int a = back ? x->gsrc : x->src, b = back ? x->grecv : x->recv;
			const size_t sz = piece(p, a, b);
			for (int k = 0; k < K; k++) {
				plan[k]->store[a].ext = plan[k]->store[b].ext = slice + at[x->to];
				at[x->to] += sz;
			}
		}
	}
	kiln_log(KILN_LOG_INFO, "pipeline", "stage %d (rank %d): %d of %d crossing tensors' activations and %d gradients in memory the stages' ranks share (%.3f MiB a rank, %d activation sets): their hand-offs move no bytes",
		 mine, world_of[mine], n_fwd, n, n_bwd, (double)bytes / 1048576.0, K);
	return KILN_OK;
}

unsigned kiln_pipe_window_direct(const struct kiln_plan *p, int mine, const unsigned char *shared)
{
	unsigned some = 0, not_all = 0;
	for (int e = 0; e < p->n_xfer; e++) {
		const struct plan_xfer *x = &p->xfer[e];
		const int peer = x->from == mine ? x->to : x->to == mine ? x->from : -1;
		if (peer < 0)
			continue;
		some |= 1u << peer;
		if (!shared[2 * e] || (x->grecv >= 0 && !shared[2 * e + 1]))
			not_all |= 1u << peer;
	}
	return some & ~not_all;
}
