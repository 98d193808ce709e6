/* core/plan_run.c - run a plan: the forward of every layer in order, then
 * the backward schedule (recomputations before the backwards that need
 * them), each layer's pass with its arena pointers, parameters and
 * profiling label.
 */
#include "graph.h"
#include "profile.h"

void *kiln_plan_store_ptr(const struct kiln_plan *p, int store, const void *x)
{
	if (store == -1)
		return (void *)x;
	if (store < 0)
		return NULL;
	if (p->store[store].ext)
		return p->store[store].ext;
	return (char *)p->arena + p->store[store].off;
}

/* The arguments of layer i's forward (late = 0) or of its recomputation
 * or backward (late = 1: recomputed outputs are read from their
 * recomputed copies). */
static void fill_run(struct kiln_plan *p, int i, struct kiln_layer_run *r, const void *x,
		     const void *labels, void *metrics, void *stream, int late)
{
	struct kiln_model *m = p->m;
	struct model_layer *L = &m->layers[i];
	struct plan_node *nd = &p->nodes[i];
	memset(r, 0, sizeof *r);
	r->dev = kiln_plan_dev(p, i);
	r->stream = stream;
	r->training = p->training;
	r->batch = p->batch;
	for (int k = 0; k < L->n_in; k++) {
		int src = L->in[k];
		/* a tensor from another stage: its receive buffers on this one */
		const struct plan_xfer *xf = nd->xfer1[k] ? &p->xfer[nd->xfer1[k] - 1] : NULL;
		int xs = xf ? xf->recv : late ? kiln_plan_late_store(p, src) : kiln_plan_fwd_store(p, src);
		r->x[k] = kiln_plan_store_ptr(p, xs, x);
		if (p->training && nd->dx_on[k]) {
			int gs = xf ? xf->grecv : src < 0 ? p->data_gstore : p->nodes[src].gstore;
			r->dx[k] = kiln_plan_store_ptr(p, gs, x);
			r->dx_accum[k] = nd->dx_accum[k];
		}
	}
	r->y = kiln_plan_store_ptr(p, late ? kiln_plan_late_store(p, i) : nd->ystore, x);
	if (p->training)
		r->dy = kiln_plan_store_ptr(p, nd->gstore, x);
	for (int k = 0; k < L->n_params; k++) {
		const struct model_param *pm = &m->params[L->pidx[k]];
		r->w[k] = (pm->buffer ? m->buffers_d : m->params_d) + pm->off;
		/* the compute copy only for a layer that computes in its dtype:
		 * reads or writes activations in it (plugin.h: NULL with f32
		 * compute, e.g. a layer norm of the f32 residual stream; a
		 * linear layer on it converts x and writes the compute dtype) */
		if (m->params_c && !pm->buffer && kiln_node_low_precision(nd, m->cdtype))
			r->wc[k] = (char *)m->params_c + pm->off * kiln_dtype_size(m->cdtype);
		r->dw[k] = p->training ? kiln_model_grad_dst(m, m->grad_out_d ? m->grad_out_d
									       : m->grads_d, i, k)
				       : NULL;
	}
	/* a user of a tied weight that writes it beside (tie_grad) writes */
	r->dw_accum = p->training && m->grad_accum && L->tie_grad < 0;
	r->workspace = p->ws;
	r->workspace_bytes = p->ws_bytes;
	r->labels = labels;
	r->metrics = metrics;
	r->grad_scale = 1.0f / (float)p->batch;
	int ss = late && nd->rsstore >= 0 ? nd->rsstore : nd->sstore;
	r->saved = ss >= 0 ? kiln_plan_store_ptr(p, ss, x) : NULL;
	r->step = p->step_d ? p->step_d : m->drop_d;
	r->loss_scale = p->seed_d ? p->seed_d : m->scaler_d; /* the scale is element 0 */
	r->group = p->training && m->group_ranks > 1 ? m->group : NULL;
	r->pos = p->pos;
}

int kiln_model_grad_accum_ok(const struct kiln_model *m)
{
	for (int i = 0; i < m->n_layers; i++) {
		const struct model_layer *L = &m->layers[i];
		int trained = 0;
		for (int k = 0; k < L->n_params; k++)
			trained += m->params[L->pidx[k]].trainable && !m->params[L->pidx[k]].buffer;
		if (trained && L->type->abi_minor < 9)
			return 0;
		if (L->tie_grad >= 0 && trained > 1)
			return 0;
	}
	return 1;
}

kiln_status kiln_plan_run(struct kiln_plan *p, const void *x, const void *labels, void *metrics,
			  void *stream)
{
	kiln_status st = kiln_plan_forward(p, x, labels, metrics, stream);
	return st ? st : kiln_plan_backward(p, x, labels, metrics, stream);
}

/* Layer i's forward or backward pass.  When profiling, the layer's name
 * and pass label the ops it runs (the device wrapper reads the label) and
 * the pass is a span of the trace's layer track. */
static kiln_status run_node(struct kiln_plan *p, int i, int pass, struct kiln_layer_run *r,
			    struct kiln_profile *prof)
{
	const struct kiln_host *h = kiln_host_table();
	struct plan_node *nd = &p->nodes[i];
	if (!prof)
		return pass == KILN_PHASE_BACKWARD ? nd->ops->backward(h, &nd->l, r)
						   : nd->ops->forward(h, &nd->l, r);
	const char *name = p->m->layers[i].name;
	kiln_profile_label(name, pass);
	int64_t t0 = kiln_now_ns();
	kiln_status st = pass == KILN_PHASE_BACKWARD ? nd->ops->backward(h, &nd->l, r)
						     : nd->ops->forward(h, &nd->l, r);
	kiln_profile_layer(prof, name, pass, t0, kiln_now_ns());
	kiln_profile_label(NULL, 0);
	return st;
}

/* Layer i's backward split (df, [pipeline] defer_wgrad): with a record
 * (df->rec, defer_wgrad = auto), its input, output (where its backward
 * reads it) and output's gradient copied into the micro-batch's record on
 * the stream; without (defer_wgrad = 1), the plan keeps its own alive
 * (kiln_plan.wkeep).  The backward into its inputs' gradients (no dw) on
 * the stream, and the one into its parameters' gradients (no dx) from the
 * record or the plan's buffers on the side stream with the side's
 * workspace: the same ops on the same bytes as one backward, the
 * gradients the same bit for bit. */
static kiln_status run_split(struct kiln_plan *p, int i, const struct kiln_layer_run *r,
			     const struct kiln_wdefer *df, struct kiln_profile *prof)
{
	const struct kiln_layer *l = &p->nodes[i].l;
	struct kiln_device *dev = r->dev;
	const size_t xb = kiln_tensor_bytes(&l->in[0]), yb = kiln_tensor_bytes(&l->out);
	const size_t sb = r->saved ? l->saved_bytes : 0;
	/* (no record: the plan's own buffers, alive until then, kiln_plan.wkeep) */
	char *rx = df->rec ? df->rec + df->off[i] : NULL;
	char *ry = rx && l->needs_output ? rx + kiln_align_up(xb) : NULL;
	char *rs = rx && sb ? rx + kiln_align_up(xb) + (ry ? kiln_align_up(yb) : 0) : NULL;
	char *rdy = rx ? rx + kiln_align_up(xb) + (ry ? kiln_align_up(yb) : 0) + (sb ? kiln_align_up(sb) : 0) : NULL;
	kiln_status st;
	if (df->rec &&
	    ((st = kiln_device_copy_async(dev, rx, r->x[0], xb, KILN_COPY_D2D, r->stream)) ||
	     (ry && (st = kiln_device_copy_async(dev, ry, r->y, yb, KILN_COPY_D2D, r->stream))) ||
	     (rs && (st = kiln_device_copy_async(dev, rs, r->saved, sb, KILN_COPY_D2D, r->stream))) ||
	     (st = kiln_device_copy_async(dev, rdy, r->dy, yb, KILN_COPY_D2D, r->stream))))
		return st;
	struct kiln_layer_run b = *r, w = *r;
	for (int k = 0; k < l->n_params; k++)
		b.dw[k] = NULL;
	b.dw_accum = 0;
	if ((st = run_node(p, i, KILN_PHASE_BACKWARD, &b, prof)))
		return st;
	for (int k = 0; k < l->n_in; k++)
		w.dx[k] = NULL;
	if (rx)
		w.x[0] = rx, w.y = ry, w.dy = rdy, w.saved = rs;
	w.workspace = df->ws, w.workspace_bytes = df->ws_bytes;
	w.stream = df->side;
	return run_node(p, i, KILN_PHASE_BACKWARD, &w, prof);
}

/* Schedule positions [from, to): each layer's forward (after the forward
 * hook), recomputation, or backward (then the backward hook); df: the
 * layers whose weight gradients are deferred (NULL: none). */
static kiln_status run_events(struct kiln_plan *p, int from, int to, const void *x,
			      const void *labels, void *metrics, void *stream,
			      const struct kiln_wdefer *df)
{
	struct kiln_model *m = p->m;
	struct kiln_profile *prof = kiln_device_profile(m->dev);
	struct kiln_layer_run r;
	kiln_status st;
	for (int e = from; e < to; e++) {
		const int i = p->sched[e].layer;
		const char *name = m->layers[i].name;
		switch (p->sched[e].kind) {
		case PEV_FWD:
			if ((p->decode || p->logits) && p->nodes[i].l.is_loss)
				break; /* no labels: the logits are the output */
			if (m->fwd_hook && (st = m->fwd_hook(m->fwd_user, i, stream)))
				return st;
			fill_run(p, i, &r, x, labels, metrics, stream, 0);
			if ((st = run_node(p, i, KILN_PHASE_FORWARD, &r, prof)))
				return kiln_error_wrap(st, "forward of layer '%s'", name);
			break;
		case PEV_RECOMPUTE:
			fill_run(p, i, &r, x, labels, metrics, stream, 1);
			r.recompute = 1;
			if ((st = run_node(p, i, KILN_PROF_RECOMPUTE, &r, prof)))
				return kiln_error_wrap(st, "recomputing layer '%s'", name);
			break;
		default: /* PEV_BWD */
			if (p->nodes[i].ops->backward) {
				fill_run(p, i, &r, x, labels, metrics, stream, 1);
				if ((st = df && df->off[i] != SIZE_MAX ? run_split(p, i, &r, df, prof)
								       : run_node(p, i, KILN_PHASE_BACKWARD, &r, prof)))
					return kiln_error_wrap(st, "backward of layer '%s'", name);
			}
			/* a tied weight's gradient is whole after its last user's
			 * (the adds profiled as this layer's backward) */
			if (prof && m->n_tie_elems)
				kiln_profile_label(name, KILN_PHASE_BACKWARD);
			st = kiln_model_tie_grads(m, i, stream);
			if (prof && m->n_tie_elems)
				kiln_profile_label(NULL, 0);
			if (st)
				return st;
			if (m->bwd_hook && (st = m->bwd_hook(m->bwd_user, i, stream)))
				return st;
			break;
		}
	}
	return KILN_OK;
}

/* The parameters' compute copy and the input conversion when needed
 * (lo = 0), then the forwards of layers lo..hi-1 (schedule positions). */
/* A frozen plan (kiln_plan_opts.frozen) whose model's weights were
 * written since its last run, or since the device was last told when the
 * plan is new: its device's frozen ops take them again
 * (KILN_PROC_WEIGHTS_WRITTEN of the model's memory, else
 * KILN_PROC_WEIGHTS_CHANGED; the write was enqueued before, on this
 * stream or synchronised).  The device is told once per write, by the
 * first frozen plan of the model that runs after it: the others' ops see
 * that their weights changed.  A plan made after the write tells it too
 * when no plan did: a device may keep what it made of the weights for the
 * plans made later (plugins/cpu/qweights.c). */
void kiln_plan_frozen_sync(struct kiln_plan *p)
{
	struct kiln_model *m = p->m;
	if (!p->frozen || p->wgen == m->wgen)
		return;
	if (m->wgen_told != m->wgen + 1) {
		/* the model's memory alone (KILN_PROC_WEIGHTS_WRITTEN): another
		 * model's copies on the device stay (before session 41 each
		 * load made every model's again) */
		const void *at[3] = { m->params_d, m->buffers_d, m->params_c };
		const size_t bytes[3] = { m->n_elems * sizeof(float), m->n_buf_elems * sizeof(float),
					  m->params_c ? m->n_elems * kiln_dtype_size(m->cdtype) : 0 };
		kiln_device_weights_written(m->dev, at, bytes, 3);
		m->wgen_told = m->wgen + 1;
	}
	p->wgen = m->wgen;
}

kiln_status kiln_plan_forward_range(struct kiln_plan *p, int lo, int hi, const void *x,
				    const void *labels, void *metrics, void *stream)
{
	struct kiln_model *m = p->m;
	const int n = m->n_layers;
	kiln_status st;
	if (lo > 0)
		return run_events(p, lo, hi, x, labels, metrics, stream, NULL);
	/* the compute copy's refresh reads every parameter */
	if (m->fwd_hook && m->pcopy_stale && m->pcast_plan &&
	    (st = m->fwd_hook(m->fwd_user, n, stream)))
		return st;
	if ((st = kiln_model_params_sync(m, stream)))
		return kiln_error_wrap(st, "the compute copy of the parameters");
	kiln_plan_frozen_sync(p);
	if (p->in_reorder || p->in_cast) {
		const int prof = kiln_device_profile(m->dev) != NULL;
		struct kiln_op_args a = { .in = { x }, .out = { kiln_plan_store_ptr(p, p->data_store, x) },
					  .workspace = p->ws, .workspace_bytes = p->ws_bytes };
		if (prof)
			kiln_profile_label("input", KILN_PHASE_FORWARD);
		st = kiln_device_run(kiln_plan_dev(p, -1), p->in_reorder ? p->in_reorder : p->in_cast, &a,
				    stream);
		if (prof)
			kiln_profile_label(NULL, 0);
		if (st)
			return kiln_error_wrap(st, "converting the input to the model's layout and dtype");
	}
	return run_events(p, 0, hi, x, labels, metrics, stream, NULL);
}

kiln_status kiln_plan_forward(struct kiln_plan *p, const void *x, const void *labels,
			      void *metrics, void *stream)
{
	return kiln_plan_forward_range(p, 0, p->m->n_layers, x, labels, metrics, stream);
}

/* The schedule after the forwards: backwards in reverse layer order, each
 * preceded by the recomputations it needs. */
kiln_status kiln_plan_backward(struct kiln_plan *p, const void *x, const void *labels,
			       void *metrics, void *stream)
{
	if (!p->training)
		return KILN_OK;
	return run_events(p, p->m->n_layers, p->n_pos, x, labels, metrics, stream, NULL);
}

/* The backwards of layers hi-1 down to lo, each after the recomputations
 * it triggers: the schedule's positions from the first event of layer
 * hi-1's backward to layer lo's backward.  A pipeline's plan recomputes
 * within a stage only (plan_schedule), so a stage's events are one run. */
kiln_status kiln_plan_backward_range(struct kiln_plan *p, int lo, int hi, const void *x,
				     const void *labels, void *metrics, void *stream,
				     const struct kiln_wdefer *df)
{
	const int n = p->m->n_layers;
	int from = -1, to = -1;
	if (!p->training)
		return kiln_error(KILN_EINTERNAL, "kiln_plan_backward_range: not a training plan");
	if (lo >= hi)
		return KILN_OK;
	for (int e = n; e < p->n_pos; e++) {
		const struct plan_event *ev = &p->sched[e];
		const int j = ev->kind == PEV_RECOMPUTE ? p->nodes[ev->layer].trig : ev->layer;
		if (j >= lo && j < hi) {
			if (from < 0)
				from = e;
			else if (to != e)
				return kiln_error(KILN_EINTERNAL, "kiln_plan_backward_range: layers %d..%d's backward is not one run of the schedule",
						  lo, hi - 1);
			to = e + 1;
		}
	}
	if (from < 0)
		return KILN_OK;
	for (int e = from; e < to; e++) /* (recomputing a layer of the range only) */
		if (p->sched[e].layer < lo || p->sched[e].layer >= hi)
			return kiln_error(KILN_EINTERNAL, "kiln_plan_backward_range: layer %d recomputed in layers %d..%d's backward",
					  p->sched[e].layer, lo, hi - 1);
	return run_events(p, from, to, x, labels, metrics, stream, df);
}

kiln_status kiln_plan_decode(struct kiln_plan *p, const void *tokens, const void *pos,
			     void *stream)
{
	if (!p->decode)
		return kiln_error(KILN_EINVAL, "kiln_plan_decode: not a decode plan (kiln_plan_opts.decode)");
	if (p->runs < p->m->n_layers)
		return kiln_error(KILN_EINVAL, "kiln_plan_decode: a prefill plan of the caches' state alone (kiln_model_plan_prefill, logits 0): run it with kiln_plan_decode_state");
	p->pos = pos;
	kiln_status st = kiln_plan_forward(p, tokens, NULL, NULL, stream);
	p->pos = NULL;
	return st;
}

kiln_status kiln_plan_decode_state(struct kiln_plan *p, const void *tokens, const void *pos,
				   void *stream)
{
	int hi = 0; /* the schedule's forwards up to the last that keeps state */
	if (!p->decode)
		return kiln_error(KILN_EINVAL, "kiln_plan_decode_state: not a decode plan (kiln_plan_opts.decode)");
	for (int e = 0; e < p->m->n_layers; e++)
		if (p->sched[e].kind == PEV_FWD && p->nodes[p->sched[e].layer].sstore >= 0)
			hi = e + 1;
	if (!hi)
		return KILN_OK; /* no layer keeps state: nothing to run */
	p->pos = pos;
	kiln_status st = kiln_plan_forward_range(p, 0, hi, tokens, NULL, NULL, stream);
	p->pos = NULL;
	return st;
}

/* Whether node n of a decode plan keeps no state, or lays it out by row
 * (kiln_layer.decode_caches) within its saved memory, each row whole
 * runs of decode_len positions where it says how long a position is
 * (decode_pos_bytes). */
static int rows_copyable(const struct plan_node *n)
{
	const struct kiln_layer *l = &n->l;
	if (n->sstore < 0)
		return 1;
	if (l->decode_caches <= 0 || !l->decode_row_bytes || l->n_in < 1)
		return 0;
	const size_t rows = (size_t)l->in[0].dims[0];
	const size_t run = (size_t)l->decode_len * l->decode_pos_bytes;
	if (l->decode_pos_bytes && (l->decode_len < 1 || run / (size_t)l->decode_len != l->decode_pos_bytes ||
				    l->decode_row_bytes % run))
		return 0;
	return rows && l->decode_row_bytes <= SIZE_MAX / rows &&
	       (size_t)l->decode_caches * kiln_align_up(rows * l->decode_row_bytes) <= l->saved_bytes;
}

int kiln_plan_decode_rows_copyable(const struct kiln_plan *p)
{
	if (!p->decode)
		return 0;
	for (int i = 0; i < p->m->n_layers; i++)
		if (!rows_copyable(&p->nodes[i]))
			return 0;
	return 1;
}

int kiln_plan_decode_by_position(const struct kiln_plan *p)
{
	if (!p->decode)
		return 0;
	for (int i = 0; i < p->m->n_layers; i++)
		if (p->nodes[i].sstore >= 0 && !p->nodes[i].l.decode_pos_bytes)
			return 0;
	return 1;
}

/* Positions 0..n-1 of row 0 of node s's caches (of plan src) into every
 * row of node d's (of dst), adding the bytes written to *bytes.  A row of
 * runs of decode_len positions (kiln_layer.decode_pos_bytes) has each
 * run's first n positions copied, a copy a run and row; a row copied
 * whole (decode_pos_bytes 0, or n = decode_len) is copied to row 0, then
 * rows [0, k) into [k, 2k), so that B rows take 1 + log2(B) copies. */
static kiln_status copy_rows(struct kiln_device *dev, const struct kiln_plan *dst,
			     const struct plan_node *d, const struct kiln_plan *src,
			     const struct plan_node *s, int64_t n, void *stream, size_t *bytes)
{
	const struct kiln_layer *l = &d->l;
	const size_t rb = l->decode_row_bytes;
	const size_t run = l->decode_pos_bytes ? (size_t)l->decode_len * l->decode_pos_bytes : rb;
	const size_t len = l->decode_pos_bytes ? (size_t)n * l->decode_pos_bytes : rb;
	const int64_t B = l->in[0].dims[0], sB = s->l.in[0].dims[0];
	char *dp = kiln_plan_store_ptr(dst, d->sstore, NULL);
	const char *sp = kiln_plan_store_ptr(src, s->sstore, NULL);
	kiln_status st = KILN_OK;
	for (int c = 0; c < l->decode_caches && !st; c++) {
		char *dc = dp + (size_t)c * kiln_align_up((size_t)B * rb);
		const char *sc = sp + (size_t)c * kiln_align_up((size_t)sB * rb);
		if (len < run) { /* each run's filled positions, row by row */
			for (int64_t b = 0; b < B && !st; b++)
				for (size_t r = 0; r < rb / run && !st; r++)
					st = kiln_device_copy_async(dev, dc + (size_t)b * rb + r * run, sc + r * run, len,
								    KILN_COPY_D2D, stream);
			*bytes += (size_t)B * (rb / run) * len;
			continue;
		}
		st = kiln_device_copy_async(dev, dc, sc, rb, KILN_COPY_D2D, stream);
		for (int64_t k = 1; k < B && !st; k *= 2)
			st = kiln_device_copy_async(dev, dc + (size_t)k * rb, dc,
						    rb * (size_t)(B - k < k ? B - k : k), KILN_COPY_D2D, stream);
		*bytes += (size_t)B * rb;
	}
	return st;
}

kiln_status kiln_plan_decode_copy_rows(struct kiln_plan *dst, const struct kiln_plan *src, int64_t n,
				       void *stream, size_t *bytes)
{
	*bytes = 0;
	if (!dst->decode || src->decode != dst->decode || src->m != dst->m || n < 1 || n > dst->decode)
		return kiln_error(KILN_EINTERNAL, "kiln_plan_decode_copy_rows: two decode plans of one model and length, 1 to %lld positions (%lld given)",
				  (long long)dst->decode, (long long)n);
	if (!kiln_plan_decode_rows_copyable(dst) || !kiln_plan_decode_rows_copyable(src))
		return kiln_error(KILN_ENOTSUP, "a layer of the model keeps decoding state it does not lay out by row (kiln_layer.decode_caches, ABI 2.26)");
	for (int i = 0; i < dst->m->n_layers; i++) {
		const struct plan_node *d = &dst->nodes[i], *s = &src->nodes[i];
		if (d->sstore < 0 && s->sstore < 0)
			continue;
		if (d->sstore < 0 || s->sstore < 0 || d->l.decode_caches != s->l.decode_caches ||
		    d->l.decode_row_bytes != s->l.decode_row_bytes ||
		    d->l.decode_pos_bytes != s->l.decode_pos_bytes)
			return kiln_error(KILN_EINTERNAL, "layer '%s' lays out its decoding caches differently at %lld and %lld rows",
					  dst->m->layers[i].name, (long long)dst->batch, (long long)src->batch);
		kiln_status st = copy_rows(kiln_plan_dev(dst, i), dst, d, src, s, n, stream, bytes);
		if (st)
			return kiln_error_wrap(st, "copying the decoding caches of layer '%s'", dst->m->layers[i].name);
	}
	return KILN_OK;
}

kiln_status kiln_plan_logits(const struct kiln_plan *p, void **ptr, struct kiln_tensor_desc *desc)
{
	if (!p->decode && !p->logits)
		return kiln_error(KILN_EINVAL, "kiln_plan_logits: not a decode or inference plan (kiln_plan_opts.decode, .logits)");
	if (kiln_plan_fwd_store(p, p->logits_layer) < 0)
		return kiln_error(KILN_EINVAL, "kiln_plan_logits: a prefill plan of the caches' state alone (kiln_model_plan_prefill, logits 0) computes no logits");
	*desc = p->nodes[p->logits_layer].l.out;
	*ptr = kiln_plan_store_ptr((struct kiln_plan *)p, kiln_plan_fwd_store(p, p->logits_layer), NULL);
	return KILN_OK;
}
