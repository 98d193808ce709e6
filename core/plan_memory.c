/* core/plan_memory.c - the planner's memory plan: the schedule (with
 * gradient checkpointing), the storages and their lifetimes, in-place
 * merges, gradient write/accumulate decisions and the arena packing.
 *
 * Schedule.  A training plan runs forward of layer i at position i and its
 * backward at 2n-1-i.  Every activation (a "storage": a layer output, with
 * views such as flatten sharing their input's storage) lives from its
 * producer's position to its last reader's; gradients likewise from their
 * first writer in backward to the producer's backward.  Storages whose
 * lifetimes do not overlap share arena bytes.
 */
#include "pipeline.h"

#include <limits.h>

int kiln_plan_root_y(const struct plan_node *nodes, const struct kiln_model *m, int i)
{
	/* follow views down to the storage that owns the bytes */
	while (i >= 0 && nodes[i].l.is_view)
		i = m->layers[i].in[0];
	return i; /* -1: the data input */
}

static void extend(struct storage *s, int pos)
{
	if (pos < s->start)
		s->start = pos;
	if (pos > s->end)
		s->end = pos;
}

/* Greedy packing: biggest first, each at the lowest offset free for its
 * whole lifetime. */
static size_t pack(struct storage *s, int n)
{
	int *order = malloc(sizeof(int) * (size_t)(n ? n : 1));
	int *placed = malloc(sizeof(int) * (size_t)(n ? n : 1));
	size_t top = 0;
	int np = 0;
	if (!order || !placed) {
		free(order);
		free(placed);
		return (size_t)-1;
	}
	for (int i = 0; i < n; i++)
		order[i] = i;
	for (int i = 1; i < n; i++) /* insertion sort by size, descending */
		for (int j = i; j > 0 && s[order[j]].bytes > s[order[j - 1]].bytes; j--) {
			int t = order[j];
			order[j] = order[j - 1];
			order[j - 1] = t;
		}
	for (int oi = 0; oi < n; oi++) {
		struct storage *a = &s[order[oi]];
		if (!a->bytes)
			continue;
		size_t off = 0;
		for (int again = 1; again;) {
			again = 0;
			for (int k = 0; k < np; k++) {
				struct storage *b = &s[placed[k]];
				int live = a->start <= b->end && b->start <= a->end;
				int mem = off < b->off + b->bytes && b->off < off + a->bytes;
				if (live && mem) {
					off = kiln_align_up(b->off + b->bytes);
					again = 1;
				}
			}
		}
		a->off = off;
		placed[np++] = order[oi];
		size_t end;
		if (__builtin_add_overflow(off, a->bytes, &end) || end > SIZE_MAX / 2)
			top = SIZE_MAX; /* an arena no device has: refused by the caller */
		else if (end > top)
			top = end;
	}
	free(order);
	free(placed);
	return top == SIZE_MAX ? top : kiln_align_up(top);
}

kiln_status kiln_plan_new_store(struct kiln_plan *p, size_t bytes, int start, int end)
{
	if (bytes > KILN_TENSOR_MAX_BYTES)
		return kiln_error(KILN_ECONFIG, "a plan needs a buffer of %zu bytes, more than the %llu any tensor may have",
				  bytes, (unsigned long long)KILN_TENSOR_MAX_BYTES);
	struct storage *ns = kiln_grow(p->store, p->n_store, &p->store_cap, sizeof *ns, 32);
	if (!ns)
		return kiln_error(KILN_ENOMEM, "out of memory");
	p->store = ns;
	p->store[p->n_store++] = (struct storage){ .bytes = bytes, .start = start, .end = end };
	return KILN_OK;
}

/* Gradient checkpointing: decide which outputs are recomputed and lay out
 * the schedule.  With S segments (balanced by output bytes) an output is
 * recomputed when it lies in any segment but the last and only layers of
 * its own segment read it; `[layer.X] recompute = 1` asks for one layer's
 * output alone, and for what its forward keeps for its backward (saved
 * state).  A recomputed output is computed again just before the first
 * backward (or recomputation) that reads it, or for saved state asked
 * for by the key, before the layer's own backward, so the
 * recomputations of a segment run in layer order right before its first
 * backward needs them.  (Before session 41 the key was silently a no-op
 * on a layer whose output no backward reads: an lstm feeding a concat
 * kept its 2.75 MiB of saved state in examples/seq2seq.ini.)  Sets
 * nodes[].trig, pos_r, pos_b and p->sched. */
static kiln_status plan_schedule(struct kiln_plan *p, int S)
{
	struct kiln_model *m = p->m;
	struct plan_node *N = p->nodes;
	const int n = m->n_layers;
	kiln_status st;
	int *seg = calloc((size_t)n, sizeof(int)), *rec = calloc((size_t)n, sizeof(int));
	if (!seg || !rec) {
		st = kiln_error(KILN_ENOMEM, "out of memory");
		goto out;
	}
	size_t total = 0, acc = 0;
	for (int i = 0; i < n; i++)
		if (!N[i].l.is_loss && !N[i].l.is_view)
			total += kiln_tensor_bytes(&N[i].l.out);
	for (int i = 0, s = 0; i < n; i++) {
		seg[i] = s;
		if (!N[i].l.is_loss && !N[i].l.is_view)
			acc += kiln_tensor_bytes(&N[i].l.out);
		if (s < S - 1 && (double)acc >= (double)total * (s + 1) / S)
			s++;
	}
	for (int i = 0; i < n && p->training; i++) {
		int own = 0;
		kiln_config_get_bool(m->cfg, m->layers[i].section, "recompute", &own);
		if (N[i].l.is_loss || N[i].l.is_view || kiln_plan_root_y(N, m, i) != i)
			continue;
		int inside = S > 1 && seg[i] < S - 1, staged = 1;
		for (int j = i + 1; j < n; j++)
			for (int k = 0; k < m->layers[j].n_in; k++)
				if (kiln_plan_root_y(N, m, m->layers[j].in[k]) == i) {
					inside = inside && seg[j] == seg[i];
					/* a pipeline's stage recomputes only what its own
					 * layers read: an output read on a later stage is
					 * sent there, and kept */
					staged = staged && (!p->staged || m->stage[j] == m->stage[i]);
				}
		rec[i] = !staged ? 0 : own ? 2 : inside; /* 2: asked for by the key */
	}
	/* triggers, last layer first: a recomputed output is needed by its
	 * own backward (needs_output, or its saved state where the key asks
	 * for it: segments recompute outputs), by readers' backwards
	 * (needs_input) and by readers' recomputations */
	for (int i = 0; i < n; i++)
		N[i].trig = -1;
	for (int j = n - 1; j >= 0; j--) {
		if (rec[j] && (N[j].l.needs_output || (rec[j] == 2 && N[j].l.saved_bytes)) &&
		    j > N[j].trig)
			N[j].trig = j;
		for (int k = 0; k < m->layers[j].n_in; k++) {
			int r = kiln_plan_root_y(N, m, m->layers[j].in[k]);
			if (r < 0 || !rec[r])
				continue;
			if (N[j].l.needs_input && j > N[r].trig)
				N[r].trig = j;
			if (rec[j] && N[j].trig > N[r].trig)
				N[r].trig = N[j].trig;
		}
	}
	p->n_recomputed = 0;
	for (int i = 0; i < n; i++)
		p->n_recomputed += N[i].trig >= 0;
	p->n_segments = S;
	p->n_pos = 2 * n + p->n_recomputed;
	if (!(p->sched = calloc(2 * (size_t)n + (size_t)p->n_recomputed, sizeof *p->sched))) {
		st = kiln_error(KILN_ENOMEM, "out of memory");
		goto out;
	}
	int pos = 0;
	for (int i = 0; i < n; i++)
		p->sched[pos++] = (struct plan_event){ PEV_FWD, i };
	for (int j = n - 1; j >= 0; j--) {
		for (int i = 0; i <= j; i++)
			if (N[i].trig == j) {
				N[i].pos_r = pos;
				p->sched[pos++] = (struct plan_event){ PEV_RECOMPUTE, i };
			}
		N[j].pos_b = pos;
		p->sched[pos++] = (struct plan_event){ PEV_BWD, j };
	}
	st = KILN_OK;
out:
	free(seg);
	free(rec);
	return st;
}

/* Every reference to a storage the plan holds, each visited with what
 * holds it (a layer's, -1 for the plan's or a crossing tensor's) and its
 * index: the nodes' outputs, gradients, saved state and recomputed
 * copies, the data input's copy and gradient, the crossing tensors'
 * buffers.  A merge re-points them all (store_merge); plan_check refuses
 * one left on a storage a merge emptied. */
typedef int store_ref_fn(int *ref, const char *what, int layer, void *arg);

static int store_refs(struct kiln_plan *p, store_ref_fn *fn, void *arg)
{
	struct plan_node *N = p->nodes;
	int stop = 0;
	for (int i = 0; i < p->m->n_layers && !stop; i++)
		stop = fn(&N[i].ystore, "output", i, arg) || fn(&N[i].gstore, "gradient", i, arg) ||
		       fn(&N[i].sstore, "saved state", i, arg) ||
		       fn(&N[i].rstore, "recomputed output", i, arg) ||
		       fn(&N[i].rsstore, "recomputed saved state", i, arg);
	stop = stop || fn(&p->data_store, "the data input's copy", -1, arg) ||
	       fn(&p->data_gstore, "the data input's gradient", -1, arg);
	for (int e = 0; e < p->n_xfer && !stop; e++) {
		struct plan_xfer *x = &p->xfer[e];
		stop = fn(&x->src, "a crossing tensor's source", -1, arg) ||
		       fn(&x->recv, "a crossing tensor's receive buffer", -1, arg) ||
		       fn(&x->gsrc, "a crossing tensor's gradient", -1, arg) ||
		       fn(&x->grecv, "a crossing tensor's received gradient", -1, arg) ||
		       fn(&x->gtmp, "a crossing tensor's gradient to add", -1, arg);
	}
	return stop;
}

static int repoint(int *ref, const char *what, int layer, void *arg)
{
	const int *from_to = arg;
	(void)what, (void)layer;
	if (*ref == from_to[0])
		*ref = from_to[1];
	return 0;
}

/* Storage `gone` merged into `into` (whose lifetime the caller has made
 * cover both): gone emptied, every reference to it re-pointed. */
static void store_merge(struct kiln_plan *p, int gone, int into)
{
	int from_to[2] = { gone, into };
	p->store[gone] = (struct storage){ 0 };
	store_refs(p, repoint, from_to);
}

/* In place: give output storage `mine` (first written at schedule position
 * pos) the memory of `theirs` when theirs is last read there and the sizes
 * match; the merged storage lives as long as either did.  Returns 1 when
 * merged. */
static int merge_in_place(struct kiln_plan *p, int mine, int theirs, int pos)
{
	struct storage *S = p->store;
	if (mine < 0 || theirs < 0 || mine == theirs || S[theirs].bytes != S[mine].bytes ||
	    S[theirs].end != pos)
		return 0;
	if (S[mine].end > S[theirs].end)
		S[theirs].end = S[mine].end;
	store_merge(p, mine, theirs);
	return 1;
}

/* Output storages (views share their input's); a recomputed output has a
 * second storage for its recomputed copy, and so does what its forward
 * keeps for the backward. */
static kiln_status plan_output_stores(struct kiln_plan *p)
{
	struct kiln_model *m = p->m;
	struct plan_node *N = p->nodes;
	kiln_status st;
	for (int i = 0; i < m->n_layers; i++) {
		int r = kiln_plan_root_y(N, m, i);
		const int rec = N[i].trig >= 0;
		N[i].rstore = N[i].rsstore = -2;
		if (i >= p->runs) { /* never run (plan_state_cut): no storage */
			N[i].ystore = N[i].sstore = -2;
			continue;
		}
		if (N[i].l.is_loss) {
			N[i].ystore = -2;
		} else if (r == i) {
			N[i].ystore = p->n_store;
			if ((st = kiln_plan_new_store(p, kiln_tensor_bytes(&N[i].l.out), i, i)))
				return st;
			if (rec) {
				N[i].rstore = p->n_store;
				if ((st = kiln_plan_new_store(p, kiln_tensor_bytes(&N[i].l.out),
							      N[i].pos_r, N[i].pos_r)))
					return st;
			}
		} else {
			N[i].ystore = r < 0 ? p->data_store : N[r].ystore;
			N[i].rstore = r < 0 ? -2 : N[r].rstore;
		}
		N[i].sstore = -2;
		if (p->decode && N[i].l.saved_bytes) {
			/* a decode plan's key/value caches: kept from run to run */
			N[i].sstore = p->n_store;
			if ((st = kiln_plan_new_store(p, N[i].l.saved_bytes, 0, p->n_pos)))
				return st;
		} else if (p->training && N[i].l.saved_bytes) {
			N[i].sstore = p->n_store;
			if ((st = kiln_plan_new_store(p, N[i].l.saved_bytes, i, rec ? i : N[i].pos_b)))
				return st;
			if (rec) {
				N[i].rsstore = p->n_store;
				if ((st = kiln_plan_new_store(p, N[i].l.saved_bytes, N[i].pos_r,
							      N[i].pos_b)))
					return st;
			}
		}
	}
	return KILN_OK;
}

/* Output lifetimes: readers' forwards read the forward copy;
 * recomputations and backwards read the late copy. */
static void plan_output_lifetimes(struct kiln_plan *p)
{
	struct kiln_model *m = p->m;
	struct plan_node *N = p->nodes;
	const int training = p->training;
	for (int j = 0; j < p->runs; j++) { /* (the layers that run read) */
		struct model_layer *L = &m->layers[j];
		int ls = kiln_plan_late_store(p, j);
		if (training && N[j].l.needs_output && ls >= 0)
			extend(&p->store[ls], N[j].pos_b);
		for (int k = 0; k < L->n_in; k++) {
			int fs = kiln_plan_fwd_store(p, L->in[k]);
			if (fs >= 0)
				extend(&p->store[fs], j);
			if (!training || (ls = kiln_plan_late_store(p, L->in[k])) < 0)
				continue;
			if (N[j].l.needs_input)
				extend(&p->store[ls], N[j].pos_b);
			if (N[j].trig >= 0)
				extend(&p->store[ls], N[j].pos_r);
		}
	}
}

/* Layer i reads input k's bytes at another of its inputs too (`inputs =
 * a, b, a`, or a view of a: a flatten of it): its output over that input
 * would change what the later read sees (the add's third input is added
 * after the first two), and that input's gradient gets a second share in
 * the same backward.  Compared by the storage that owns the bytes (views
 * followed down). */
static int input_repeats(const struct kiln_plan *p, int i, int k)
{
	const struct model_layer *L = &p->m->layers[i];
	const int a = kiln_plan_root_y(p->nodes, p->m, L->in[k]);
	for (int q = 0; q < L->n_in; q++)
		if (q != k && kiln_plan_root_y(p->nodes, p->m, L->in[q]) == a)
			return 1;
	return 0;
}

/* In place: a layer that may overwrite an input (inplace_ok bit k) takes
 * that input's storage when nothing reads the input after this layer's
 * forward (its lifetime ends here) and the sizes match; the same again for
 * a recomputed copy at its recomputation.  Decided from the lifetimes
 * alone, so the arithmetic is unchanged. */
static void plan_in_place(struct kiln_plan *p)
{
	struct kiln_model *m = p->m;
	struct plan_node *N = p->nodes;
	for (int i = 0; i < p->runs; i++) {
		int allow = 1, fwd = 0, late = N[i].rstore < 0;
		kiln_config_get_bool(m->cfg, m->layers[i].section, "inplace", &allow);
		if (!allow || !N[i].l.inplace_ok || N[i].l.is_view || kiln_plan_root_y(N, m, i) != i)
			continue;
		for (int k = 0; k < m->layers[i].n_in; k++) {
			int src = m->layers[i].in[k];
			if (src < 0 || !(N[i].l.inplace_ok >> k & 1) || !kiln_pipe_same_stage(p, src, i) ||
			    input_repeats(p, i, k))
				continue;
			if (!fwd &&
			    (fwd = merge_in_place(p, N[i].ystore, kiln_plan_fwd_store(p, src), i)))
				kiln_log(KILN_LOG_DEBUG, "core", "layer '%s' runs in place on '%s''s output",
					 m->layers[i].name, m->layers[src].name);
			if (!late)
				late = merge_in_place(p, N[i].rstore, kiln_plan_late_store(p, src),
						      N[i].pos_r);
		}
	}
}

/* Gradient storages of a training plan, walking backward: the first
 * writer of a gradient writes it, later ones add to it. */
static kiln_status plan_gradients(struct kiln_plan *p, const int *wants_grad)
{
	struct kiln_model *m = p->m;
	struct plan_node *N = p->nodes;
	const int n = m->n_layers;
	kiln_status st;
	if (p->input_grad) {
		p->data_gstore = p->n_store;
		if ((st = kiln_plan_new_store(p, kiln_tensor_bytes(&p->data_desc), 1 << 30, p->n_pos)))
			return st;
	}
	for (int i = 0; i < n; i++) {
		int r = kiln_plan_root_y(N, m, i);
		if (!wants_grad[i] || N[i].l.is_loss) {
			N[i].gstore = -2;
		} else if (r == i) {
			N[i].gstore = p->n_store;
			if ((st = kiln_plan_new_store(p, kiln_tensor_bytes(&N[i].l.out), 1 << 30, -1)))
				return st;
			/* read by the producer's backward */
			extend(&p->store[N[i].gstore], N[i].pos_b);
		} else {
			N[i].gstore = r < 0 ? p->data_gstore : N[r].gstore;
		}
	}
	if ((st = kiln_pipe_plan_xfer_grads(p)))
		return st;
	char *written = calloc((size_t)(p->n_store ? p->n_store : 1), 1);
	if (!written)
		return kiln_error(KILN_ENOMEM, "out of memory");
	for (int j = n - 1; j >= 0; j--) {
		struct model_layer *L = &m->layers[j];
		for (int k = 0; k < L->n_in; k++) {
			int src = L->in[k];
			int gs = src < 0 ? p->data_gstore : N[src].gstore;
			if (gs < 0 || N[j].l.is_view)
				continue;
			if (N[j].xfer1[k]) /* written on this stage, returned after its backward */
				gs = kiln_pipe_xfer_grad(p, N[j].xfer1[k] - 1, written);
			N[j].dx_on[k] = 1;
			N[j].dx_accum[k] = written[gs];
			written[gs] = 1;
			extend(&p->store[gs], N[j].pos_b);
		}
	}
	free(written);
	return KILN_OK;
}

/* The earliest backward position after `pos` that adds into gradient
 * storage gs (a later consumer's accumulate); INT_MAX when none. */
static int accum_after(const struct kiln_plan *p, int gs, int pos)
{
	const struct kiln_model *m = p->m;
	const struct plan_node *N = p->nodes;
	int first = INT_MAX;
	for (int j = 0; j < m->n_layers; j++)
		for (int k = 0; k < m->layers[j].n_in; k++) {
			const int src = m->layers[j].in[k];
			if (src >= 0 && N[j].dx_on[k] && N[j].dx_accum[k] && N[src].gstore == gs &&
			    N[j].pos_b > pos && N[j].pos_b < first)
				first = N[j].pos_b;
		}
	return first;
}

/* Input gradients that are the output's (dx_is_dy: the residual add, the
 * positional embedding): input k's gradient storage merges into the output
 * gradient's, so the backward copies nothing, when this backward writes it
 * first and the two stay
 * equal while both are read: after this backward, no write into one comes
 * before the last read of the other (a gradient is read last by its
 * producer's backward, at its storage's end).  In the GPT's blocks both
 * inputs of each add qualify (the branch's gradient is read by its c_proj
 * right away; the residual's is first added to by the layernorm before
 * it), so the residual stream's gradient is one buffer.  Not in keep_all
 * plans (each gradient is read after the step), pipelined plans (a
 * gradient crosses stages), with [layer.X] inplace = 0, nor for an input
 * the layer reads twice (input_repeats). */
static void plan_grad_alias(struct kiln_plan *p)
{
	struct kiln_model *m = p->m;
	struct plan_node *N = p->nodes;
	struct storage *S = p->store;
	if (p->keep_all || p->staged)
		return;
	for (int j = m->n_layers - 1; j >= 0; j--) {
		const struct model_layer *L = &m->layers[j];
		const int go = N[j].gstore, at = N[j].pos_b;
		int allow = 1;
		kiln_config_get_bool(m->cfg, L->section, "inplace", &allow);
		if (!allow || !N[j].l.dx_is_dy || go < 0)
			continue;
		for (int k = 0; k < L->n_in; k++) {
			const int src = L->in[k];
			const int gs = src >= 0 ? N[src].gstore : -2;
			if (!(N[j].l.dx_is_dy >> k & 1) || !N[j].dx_on[k] || N[j].dx_accum[k] ||
			    N[j].xfer1[k] || input_repeats(p, j, k) || gs < 0 || gs == go || gs == p->data_gstore ||
			    S[gs].bytes != S[go].bytes || accum_after(p, go, at) <= S[gs].end ||
			    accum_after(p, gs, at) <= S[go].end)
				continue;
			extend(&S[go], S[gs].start);
			extend(&S[go], S[gs].end);
			store_merge(p, gs, go);
			kiln_log(KILN_LOG_DEBUG, "core", "layer '%s': the gradient of '%s' is its own",
				 L->name, m->layers[src].name);
		}
	}
}

/* The gradient over its input: a layer whose backward may write input 0's
 * gradient over input 0 (dx_over_input: the loss layers) gets that
 * gradient in the input's storage (the copy its backward reads) when that
 * backward is the input's last reader, it writes the gradient first and
 * the sizes match; the merged storage lives until the gradient's last
 * reader.  The logits and their gradient are then one buffer, as in
 * llm.c.  Not with [layer.X] inplace = 0, in keep_all plans (their
 * outputs are read after the step), on a device built before ABI 2.4, nor
 * where the input crosses a pipeline stage (xfer1): there the loss reads
 * the receive buffer and writes the gradient into the crossing tensor's
 * gradient receive buffer (grecv), which the return copies into the
 * producer's gradient storage (gsrc) on its own stage; merging that
 * storage into the producer's output left the return writing into a
 * storage of no bytes and the producer's backward reading its own output
 * (the logits) as its gradient (issue 21). */
static void plan_grad_over_input(struct kiln_plan *p)
{
	struct kiln_model *m = p->m;
	struct plan_node *N = p->nodes;
	struct storage *S = p->store;
	if (p->keep_all || !m->dev || kiln_device_abi_minor(m->dev) < 4)
		return;
	for (int j = 0; j < m->n_layers; j++) {
		const int src = m->layers[j].n_in ? m->layers[j].in[0] : -1;
		int allow = 1;
		kiln_config_get_bool(m->cfg, m->layers[j].section, "inplace", &allow);
		if (!allow || !N[j].l.dx_over_input || src < 0 || !N[j].dx_on[0] || N[j].dx_accum[0] ||
		    N[j].xfer1[0])
			continue;
		const int gs = N[src].gstore, xs = kiln_plan_late_store(p, src);
		if (gs < 0 || xs < 0 || gs == xs || S[gs].bytes != S[xs].bytes ||
		    S[xs].end != N[j].pos_b)
			continue;
		if (S[gs].end > S[xs].end)
			S[xs].end = S[gs].end;
		store_merge(p, gs, xs);
		kiln_log(KILN_LOG_DEBUG, "core", "layer '%s' writes its input's gradient over '%s''s output",
			 m->layers[j].name, m->layers[src].name);
	}
}

/* Deferred weight gradients reading the plan's own buffers ([pipeline]
 * defer_wgrad = 1, core/pipe_wgrad.c): a deferrable layer's weight
 * gradient runs after its stage's later backwards, and the stages before
 * it run theirs meanwhile, so what it reads (its input, its output where
 * its backward reads it, saved state, its output's gradient) lives to the
 * schedule's end: no storage of the same micro-batch shares those bytes.
 * (The next micro-batch to take this plan enters only after every stage
 * ran this one's: kiln_pipe_step's release.) */
static void plan_wkeep(struct kiln_plan *p)
{
	const struct kiln_model *m = p->m;
	const struct plan_node *N = p->nodes;
	for (int i = 0; i < m->n_layers; i++) {
		if (!kiln_pipe_wgrad_record(m, p, i))
			continue;
		const struct plan_xfer *xf = N[i].xfer1[0] ? &p->xfer[N[i].xfer1[0] - 1] : NULL;
		const int keep[4] = { xf ? xf->recv : kiln_plan_late_store(p, m->layers[i].in[0]),
				      N[i].l.needs_output ? kiln_plan_late_store(p, i) : -1,
				      N[i].rsstore >= 0 ? N[i].rsstore : N[i].sstore, N[i].gstore };
		for (int k = 0; k < 4; k++)
			if (keep[k] >= 0)
				extend(&p->store[keep[k]], p->n_pos);
	}
}

/* plan_check's: the first reference to a storage out of range or
 * emptied by a merge */
struct dangling {
	const struct kiln_plan *p;
	int store, layer;
	const char *what;
};

static int find_dangling(int *ref, const char *what, int layer, void *arg)
{
	struct dangling *d = arg;
	if (*ref < 0 || (*ref < d->p->n_store && d->p->store[*ref].bytes))
		return 0;
	d->store = *ref, d->layer = layer, d->what = what;
	return 1;
}

/* What the plan cannot run: an input gradient without a backward, loss
 * logits read after the loss, a storage without a lifetime, a reference
 * to a storage a merge emptied (or none), a crossing gradient returned
 * into a storage smaller than it. */
kiln_status kiln_plan_check(struct kiln_plan *p)
{
	const struct kiln_model *m = p->m;
	const struct plan_node *N = p->nodes;
	for (int j = 0; j < m->n_layers && p->training; j++) {
		for (int k = 0; k < m->layers[j].n_in; k++) {
			if (N[j].dx_on[k] && !N[j].ops->backward)
				return kiln_error(KILN_ENOTSUP,
						  "layer '%s' (%s) has no backward, but its input '%s' needs a gradient",
						  m->layers[j].name, m->layers[j].type->name,
						  m->layers[j].in[k] < 0 ? "data" : m->layers[m->layers[j].in[k]].name);
		}
		if (N[j].l.is_loss && N[j].dx_accum[0])
			return kiln_error(KILN_ECONFIG,
					  "%s: the logits of loss layer '%s' are also read by a later layer; the loss must be their last reader",
					  kiln_config_where(m->cfg, m->layers[j].section, "type"),
					  m->layers[j].name);
	}
	for (int i = 0; i < p->n_store; i++)
		if (p->store[i].bytes && p->store[i].start > p->store[i].end)
			return kiln_error(KILN_EINTERNAL, "planner: storage %d has no lifetime", i);
	struct dangling d = { p, 0, 0, NULL };
	if (store_refs(p, find_dangling, &d))
		return kiln_error(KILN_EINTERNAL, "planner: %s%s%s%s is storage %d, %s", d.what,
				  d.layer >= 0 ? " of layer '" : "",
				  d.layer >= 0 ? m->layers[d.layer].name : "", d.layer >= 0 ? "'" : "",
				  d.store, d.store < p->n_store ? "emptied by a merge" : "which the plan has not");
	/* a merge that emptied a storage a crossing gradient returns into
	 * (issue 21: the return then wrote into no bytes) */
	for (int e = 0; e < p->n_xfer; e++) {
		const struct plan_xfer *x = &p->xfer[e];
		if (x->grecv >= 0 && (x->gsrc < 0 || p->store[x->gsrc].bytes < x->bytes))
			return kiln_error(KILN_EINTERNAL,
					  "planner: crossing tensor %d (stage %d to %d) returns its gradient into storage %d of %zu bytes, not %zu",
					  e, x->from, x->to, x->gsrc,
					  x->gsrc < 0 ? (size_t)0 : p->store[x->gsrc].bytes, x->bytes);
	}
	return KILN_OK;
}

kiln_status kiln_plan_memory(struct kiln_plan *p, int S, const int *wants_grad, int base)
{
	struct plan_node *N = p->nodes;
	const int n = p->m->n_layers;
	kiln_status st;
	p->n_store = base;
	for (int i = 0; i < base; i++) /* the reordered input, written first */
		p->store[i].start = p->store[i].end = 0;
	free(p->sched);
	p->sched = NULL;
	p->data_gstore = -2;
	p->n_xfer = 0;
	for (int i = 0; i < n; i++) {
		for (int k = 0; k < KILN_LAYER_MAX_INPUTS; k++)
			N[i].dx_on[k] = N[i].dx_accum[k] = N[i].xfer1[k] = 0;
		N[i].gstore = -2;
	}
	if ((st = plan_schedule(p, S)) || (st = plan_output_stores(p)))
		return st;
	plan_output_lifetimes(p);
	const int ls = kiln_plan_fwd_store(p, p->logits_layer);
	if ((p->decode || p->logits) && ls >= 0) /* the logits are read after the run */
		extend(&p->store[ls], p->n_pos);
	plan_in_place(p);
	if (p->staged && (st = kiln_pipe_plan_xfers(p)))
		return st;
	if (p->training && (st = plan_gradients(p, wants_grad)))
		return st;
	if (p->training) {
		plan_grad_alias(p);
		plan_grad_over_input(p);
		if (p->wkeep)
			plan_wkeep(p);
	}
	if ((st = kiln_plan_check(p)))
		return st;
	if (p->keep_all)
		for (int i = 0; i < p->n_store; i++)
			p->store[i].start = 0, p->store[i].end = p->n_pos;
	p->arena_bytes = pack(p->store, p->n_store);
	if (p->arena_bytes == (size_t)-1)
		return kiln_error(KILN_ENOMEM, "out of memory (or a plan whose buffers add up past the address space)");
	return KILN_OK;
}
