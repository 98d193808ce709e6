/* core/pipe_xfer.c - the planner's part of a pipeline: the tensors that
 * cross stage boundaries in a plan (activations forward, their gradients
 * backward, skip connections included), each with a receive buffer on the
 * reading stage, so that no stage reads or writes another's storage. */
#include "pipeline.h"

/* The stage of the storage holding layer src's output: its root's (views
 * share their input's storage). */
static int store_stage(const struct kiln_plan *p, int src)
{
	return kiln_pipe_stage(p->m, kiln_plan_root_y(p->nodes, p->m, src));
}

int kiln_pipe_same_stage(const struct kiln_plan *p, int src, int i)
{
	return !p->staged || store_stage(p, src) == kiln_pipe_stage(p->m, i);
}

/* The crossing tensor of storage fs read on stage `to`, made when new. */
static kiln_status find_xfer(struct kiln_plan *p, int fs, int from, int to, int dtype, int *e)
{
	for (int i = 0; i < p->n_xfer; i++)
		if (p->xfer[i].src == fs && p->xfer[i].to == to) {
			*e = i;
			return KILN_OK;
		}
	struct plan_xfer *nx = kiln_grow(p->xfer, p->n_xfer, &p->xfer_cap, sizeof *nx, 16);
	if (!nx)
		return kiln_error(KILN_ENOMEM, "out of memory");
	p->xfer = nx;
	size_t bytes = fs >= 0 ? p->store[fs].bytes : kiln_tensor_bytes(&p->data_desc);
	kiln_status st = kiln_plan_new_store(p, bytes, 0, p->n_pos);
	if (st)
		return st;
	p->xfer[p->n_xfer] = (struct plan_xfer){ .from = from, .to = to, .src = fs,
						 .recv = p->n_store - 1, .gsrc = -2, .grecv = -2,
						 .gtmp = -2, .bytes = bytes, .dtype = dtype };
	*e = p->n_xfer++;
	return KILN_OK;
}

kiln_status kiln_pipe_plan_xfers(struct kiln_plan *p)
{
	struct kiln_model *m = p->m;
	kiln_status st;
	for (int j = 0; j < m->n_layers; j++)
		for (int k = 0; k < m->layers[j].n_in; k++) {
			int src = m->layers[j].in[k], e = -1;
			int from = store_stage(p, src), to = kiln_pipe_stage(m, j);
			if (from == to)
				continue;
			int dtype = src < 0 ? p->data_desc.dtype : p->nodes[src].l.out.dtype;
			if ((st = find_xfer(p, kiln_plan_fwd_store(p, src), from, to, dtype, &e)))
				return st;
			p->nodes[j].xfer1[k] = e + 1;
		}
	return KILN_OK;
}

kiln_status kiln_pipe_plan_xfer_grads(struct kiln_plan *p)
{
	struct kiln_model *m = p->m;
	kiln_status st;
	for (int j = 0; j < m->n_layers; j++)
		for (int k = 0; k < m->layers[j].n_in; k++) {
			if (!p->nodes[j].xfer1[k])
				continue;
			struct plan_xfer *x = &p->xfer[p->nodes[j].xfer1[k] - 1];
			int src = m->layers[j].in[k];
			int gs = src < 0 ? p->data_gstore : p->nodes[src].gstore;
			if (gs < 0 || x->grecv >= 0)
				continue;
			if (src < 0)
				return kiln_error(KILN_ENOTSUP, "layer '%s' reads the data on stage %d: the data's gradient across stages is not supported",
						  m->layers[j].name, x->to);
			x->gsrc = gs;
			if ((st = kiln_plan_new_store(p, x->bytes, 0, p->n_pos)))
				return st;
			x->grecv = p->n_store - 1;
			if ((st = kiln_plan_new_store(p, x->bytes, 0, p->n_pos)))
				return st;
			x->gtmp = p->n_store - 1;
		}
	return KILN_OK;
}

int kiln_pipe_xfer_grad(struct kiln_plan *p, int e, char *written)
{
	struct plan_xfer *x = &p->xfer[e];
	if (!written[x->grecv]) {
		/* the first reader seen in backward order: the stage's
		 * backwards start here, and its return follows its last */
		int first = 0;
		while (kiln_pipe_stage(p->m, first) != x->to)
			first++;
		x->gadd = written[x->gsrc];
		written[x->gsrc] = 1;
		struct storage *g = &p->store[x->gsrc];
		const int pos = p->nodes[first].pos_b;
		if (pos < g->start)
			g->start = pos;
		if (pos > g->end)
			g->end = pos;
	}
	return x->grecv;
}

/* How many of p's crossing tensors name storage s as their producer's
 * (src) or its gradient (gsrc). */
static int xfer_uses(const struct kiln_plan *p, int s)
{
	int n = 0;
	for (int i = 0; i < p->n_xfer; i++)
		n += (p->xfer[i].src == s) + (p->xfer[i].gsrc == s);
	return n;
}

void kiln_pipe_xfer_shared(const struct kiln_plan *p, int e, int *fwd, int *bwd)
{
	const struct plan_xfer *x = &p->xfer[e];
	*fwd = x->src >= 0 && x->src != p->data_store && xfer_uses(p, x->src) == 1 &&
	       x->grecv >= 0;
	*bwd = x->grecv >= 0 && x->gsrc >= 0 && !x->gadd && x->gsrc != p->data_gstore &&
	       xfer_uses(p, x->gsrc) == 1;
}
