/* core/pipe_wgrad.c - deferred weight gradients ([pipeline] defer_wgrad;
 * docs/pipeline.md, "Deferred weight gradients").
 *
 * In one process (stages on [run] devices) each stage's backward of a
 * micro-batch is split: the input gradients (what the stage before waits
 * for) on the stage's stream as before, and the weight and bias
 * gradients of its linear layers on the stream's side stream
 * (KILN_PROC_STREAM_SIDE), which the stage's worker runs, one
 * micro-batch's at a time and in micro-batch order, whenever it reaches a
 * wait for a peer's event that is not complete yet; at the latest after
 * its backward of micro-batch j + P - 1 - s has sent its gradients (the
 * last stage: right after j's; kiln_pipe_wgrad_after), and the rest at
 * the step's end, before the optimizer (the stage's stream waits for the
 * side's last record: kiln_pipe_wgrad_drain).  With defer_wgrad = 1 the
 * deferred pass reads the plan's own buffers: the plans keep them alive
 * to the schedule's end (kiln_plan.wkeep) and a micro-batch's activation
 * set is free only after stage 0's backward P - 1 micro-batches later
 * (pipe_run.c's release).  With auto, whose plans are made before it
 * knows, a deferred layer's input, output (a fused ReLU's mask reads it)
 * and output's gradient are copied into the micro-batch's record of a
 * ring of min(M, P - s) on stage s (record j % (P - s): by the time
 * micro-batch j's backward writes it, the stage has waited for
 * micro-batch j - (P - s)'s deferred pass, kiln_pipe_wgrad_after).  auto
 * defers while the process's threads wait for a CPU (kiln_pipe_wgrad_step).
 * The pass uses a workspace of the stage's own, as the plan's may be in
 * use by another stage by then.  The same ops run on the same bytes in
 * the same order of micro-batches: the gradients are bit for bit those of
 * the schedule without it (tests/pipeline_wgrad.sh). */
#include "pipe_impl.h"
#include "graph.h"

struct pipe_wgrad {
	size_t *off;  /* per layer: its place in a micro-batch's record, SIZE_MAX: not deferred */
	size_t rec[KILN_PIPE_MAX_STAGES];   /* a micro-batch's record on stage s */
	char *ring[KILN_PIPE_MAX_STAGES];   /* nrec(s) records */
	void *ws[KILN_PIPE_MAX_STAGES];     /* the deferred passes' workspace */
	void *side[KILN_PIPE_MAX_STAGES];
	void **ev[KILN_PIPE_MAX_STAGES];    /* M: micro-batch j's group done */
	size_t ws_bytes;
	int n[KILN_PIPE_MAX_STAGES];        /* deferred layers */
};

size_t kiln_pipe_wgrad_record(const struct kiln_model *m, const struct kiln_plan *p, int i)
{
	const struct model_layer *L = &m->layers[i];
	const struct plan_node *nd = &p->nodes[i];
	const struct kiln_layer *l = &nd->l;
	int trained = 0;
	for (int k = 0; k < L->n_params; k++)
		trained += m->params[L->pidx[k]].trainable && !m->params[L->pidx[k]].buffer;
	/* a linear layer whose parameters are all trained, not tied, not
	 * recomputed: its input, output where its backward reads it (a
	 * fused ReLU's mask), saved state, output's gradient */
	if (!trained || trained != L->n_params || strcmp(L->type->name, "linear") || L->tie_slot >= 0 ||
	    nd->trig >= 0 || nd->rstore >= 0 || !nd->ops->backward || l->n_in != 1 || nd->gstore < 0)
		return 0;
	return kiln_align_up(kiln_tensor_bytes(&l->in[0])) +
	       (l->needs_output ? kiln_align_up(kiln_tensor_bytes(&l->out)) : 0) +
	       (nd->sstore >= 0 ? kiln_align_up(l->saved_bytes) : 0) + kiln_align_up(kiln_tensor_bytes(&l->out));
}

/* Why this pipeline cannot defer, or NULL. */
static const char *why_not(const struct kiln_pipe *pp)
{
	const struct kiln_model *m = pp->m;
	if (pp->mine >= 0)
		return "stages on ranks ([dist] pipeline)";
	if (!m->stage_dev)
		return "stages on one device (no [run] devices)";
	if (m->bwd_hook || pp->hook_final)
		return "a hook on each layer's gradients (data parallelism, ZeRO)";
	if (pp->grads_more)
		return "a layer plugin that cannot add its gradients (ABI before 2.9)";
	if (m->n_tie_elems)
		return "tied weights";
	if (pp->seed_op)
		return "loss scaling (fp16)";
	for (int s = 0; s < pp->P; s++)
		if (!kiln_device_proc(sdev(pp, s), KILN_PROC_STREAM_SIDE))
			return "a stage's device without side streams (KILN_PROC_STREAM_SIDE)";
		else if (kiln_device_streams_async(sdev(pp, s)) != 1)
			return "a stage's device without stream threads ([plugin.cpu] async = 0)";
	return NULL;
}

int kiln_pipe_wgrad_keep(const struct kiln_pipe *pp)
{
	return pp->defer_set && pp->P > 1 && !why_not(pp);
}

/* Records on stage s: the micro-batches whose deferred pass may be
 * pending (P - 1 - s, kiln_pipe_wgrad_after) and the one being written. */
static int nrec(const struct kiln_pipe *pp, int s)
{
	return pp->P - s < pp->M ? pp->P - s : pp->M;
}

static kiln_status stage_open(struct kiln_pipe *pp, struct pipe_wgrad *w, int s)
{
	struct kiln_device *dev = sdev(pp, s);
	kiln_status st;
	if (!w->n[s])
		return KILN_OK;
	if ((st = kiln_device_stream_side(dev, pp->sst[s], &w->side[s])) ||
	    !(w->ev[s] = calloc((size_t)pp->M, sizeof *w->ev[s])) ||
	    (!pp->wkeep &&
	     (st = kiln_device_alloc_named(dev, (size_t)nrec(pp, s) * w->rec[s], (void **)&w->ring[s],
					   "the pipeline's deferred weight gradients' inputs"))) ||
	    (st = kiln_device_alloc(dev, w->ws_bytes, &w->ws[s])))
		return st ? st : kiln_error(KILN_ENOMEM, "out of memory");
	for (int j = 0; j < pp->M; j++)
		if ((st = kiln_device_event_create(dev, &w->ev[s][j])))
			return st;
	return KILN_OK;
}

void kiln_pipe_wgrad_free(struct kiln_pipe *pp)
{
	struct pipe_wgrad *w = pp->wg;
	if (!w)
		return;
	for (int s = 0; s < pp->P; s++) {
		struct kiln_device *dev = sdev(pp, s);
		kiln_device_stream_destroy(dev, w->side[s]);
		for (int j = 0; w->ev[s] && j < pp->M; j++)
			kiln_device_event_destroy(dev, w->ev[s][j]);
		free(w->ev[s]);
		kiln_device_free(dev, w->ring[s]);
		kiln_device_free(dev, w->ws[s]);
	}
	free(w->off);
	free(w);
	pp->wg = NULL;
}

size_t kiln_pipe_wgrad_bytes(const struct kiln_pipe *pp, size_t *ws)
{
	size_t t = 0;
	*ws = 0;
	for (int s = 0; pp->wg && s < pp->P; s++)
		if (pp->wg->n[s]) {
			t += pp->wkeep ? 0 : (size_t)nrec(pp, s) * pp->wg->rec[s];
			*ws += pp->wg->ws_bytes;
		}
	return t;
}

/* The deferred layers, their records, each stage's side stream; logged.
 * *none: no layer to defer (nothing made). */
static kiln_status wgrad_build(struct kiln_pipe *pp, int *none)
{
	const struct kiln_model *m = pp->m;
	struct pipe_wgrad *w = calloc(1, sizeof *w);
	size_t *off = malloc((size_t)m->n_layers * sizeof *off);
	*none = 0;
	if (!w || !off) {
		free(w);
		free(off);
		return kiln_error(KILN_ENOMEM, "out of memory");
	}
	w->off = off;
	w->ws_bytes = kiln_align_up(pp->plan[0]->ws_bytes ? pp->plan[0]->ws_bytes : 1);
	int total = 0;
	for (int i = 0; i < m->n_layers; i++) {
		const int s = kiln_pipe_stage(m, i);
		off[i] = SIZE_MAX;
		const size_t rec = kiln_pipe_wgrad_record(m, pp->plan[0], i);
		if (!rec)
			continue;
		off[i] = w->rec[s];
		w->rec[s] += rec;
		w->n[s]++;
		total++;
	}
	pp->wg = w;
	if (!total) {
		*none = 1;
		kiln_pipe_wgrad_free(pp);
		return KILN_OK;
	}
	kiln_status st = KILN_OK;
	for (int s = 0; s < pp->P && !st; s++)
		st = stage_open(pp, w, s);
	if (st) {
		kiln_pipe_wgrad_free(pp);
		return kiln_error_wrap(st, "[pipeline] defer_wgrad");
	}
	size_t wsb, ring = kiln_pipe_wgrad_bytes(pp, &wsb);
	if (pp->wkeep)
		kiln_log(KILN_LOG_INFO, "pipeline", "deferred weight gradients: %d linear layers' (each stage runs them while it waits for a peer, and before the optimizer); from the plans' own buffers, no copies (%d activation sets, each micro-batch's until stage 0's backward P - 1 later), %.3f MiB of workspace",
			 total, pp->K, (double)wsb / 1048576.0);
	else
		kiln_log(KILN_LOG_INFO, "pipeline", "deferred weight gradients: %d linear layers' (each stage runs them while it waits for a peer, and before the optimizer); %.3f MiB of their inputs, min(M, P - s) = %d..%d micro-batches' on stage s (M = %d), %.3f MiB of workspace",
			 total, (double)ring / 1048576.0, nrec(pp, 0), nrec(pp, pp->P - 1), pp->M, (double)wsb / 1048576.0);
	return KILN_OK;
}

/* 1 where some layer's weight gradient can be deferred. */
static int any_deferrable(const struct kiln_pipe *pp)
{
	for (int i = 0; i < pp->m->n_layers; i++)
		if (kiln_pipe_wgrad_record(pp->m, pp->plan[0], i))
			return 1;
	return 0;
}

/* At the first step (the hooks and the ranks are set by then): 1 builds
 * and defers where the pipeline can (a warning where not); auto, where
 * it can and the device reads the run-queue wait, starts off and
 * watches (kiln_pipe_wgrad_step). */
static kiln_status wgrad_open(struct kiln_pipe *pp)
{
	pp->defer = -1;
	if (!pp->defer_set && !pp->wauto.want)
		return KILN_OK; /* 0 */
	const char *why = why_not(pp);
	if (why && pp->defer_set)
		kiln_log(KILN_LOG_WARN, "pipeline", "[pipeline] defer_wgrad = 1: not with %s; the weight gradients run in each backward",
			 why);
	if (why) {
		if (pp->wauto.want)
			kiln_log(KILN_LOG_DEBUG, "pipeline", "[pipeline] defer_wgrad = auto: off (not with %s)", why);
		return KILN_OK;
	}
	if (pp->wauto.want) {
		const int64_t t = any_deferrable(pp) ? kiln_device_run_wait_ns(sdev(pp, 0)) : -1;
		if (t < 0) {
			kiln_log(KILN_LOG_DEBUG, "pipeline", "[pipeline] defer_wgrad = auto: off (%s)",
				 any_deferrable(pp) ? "the device does not say how long its threads wait for a CPU"
						    : "no layer to defer");
			return KILN_OK;
		}
		pp->wauto.on = 1;
		pp->wauto.wait_ns = t;
		pp->wauto.t_ns = kiln_now_ns();
		kiln_log(KILN_LOG_INFO, "pipeline", "[pipeline] defer_wgrad = auto: off while this process's threads wait for a CPU under %.2f s a second (read every %d steps; %d readings in a row turn it on or off)",
			 KILN_PIPE_WAUTO_BUSY, KILN_PIPE_WAUTO_STEPS, KILN_PIPE_WAUTO_IN_A_ROW);
		return KILN_OK;
	}
	int none;
	kiln_status st = wgrad_build(pp, &none);
	if (!st && none)
		kiln_log(KILN_LOG_WARN, "pipeline", "[pipeline] defer_wgrad = 1: no layer to defer (a linear layer whose parameters are all trained, not tied, not recomputed); the weight gradients run in each backward");
	if (!st && !none)
		pp->defer = 1;
	return st;
}

/* defer_wgrad = auto's reading: the seconds a second the process's threads
 * waited for a CPU since the last one; on after KILN_PIPE_WAUTO_IN_A_ROW
 * busy readings in a row (the records built the first time), off after
 * as many quiet ones.  Between steps: the last step's deferred passes
 * ran before its end (kiln_pipe_wgrad_drain). */
double kiln_pipe_wauto_rate(int64_t *last_wait, int64_t *last_t, int64_t w, int64_t t)
{
	if (w < 0)
		return 0; /* unreadable: quiet, the last good reading kept */
	const double rate = w < *last_wait || t <= *last_t
				    ? 0 /* a drop: threads exited */
				    : (double)(w - *last_wait) / (double)(t - *last_t);
	*last_wait = w, *last_t = t;
	return rate;
}

static kiln_status wauto_read(struct kiln_pipe *pp)
{
	const double rate = kiln_pipe_wauto_rate(&pp->wauto.wait_ns, &pp->wauto.t_ns,
						 kiln_device_run_wait_ns(sdev(pp, 0)), kiln_now_ns());
	const int busy = rate > KILN_PIPE_WAUTO_BUSY;
	pp->wauto.hot = busy ? pp->wauto.hot + 1 : 0;
	pp->wauto.cold = busy ? 0 : pp->wauto.cold + 1;
	kiln_log(KILN_LOG_DEBUG, "pipeline", "[pipeline] defer_wgrad = auto: the process's threads waited %.3f s a second for a CPU over %d steps (%s %d in a row)",
		 rate, KILN_PIPE_WAUTO_STEPS, busy ? "busy" : "quiet", busy ? pp->wauto.hot : pp->wauto.cold);
	const int flip = pp->defer > 0 ? pp->wauto.cold >= KILN_PIPE_WAUTO_IN_A_ROW
				       : pp->wauto.hot >= KILN_PIPE_WAUTO_IN_A_ROW;
	if (!flip)
		return KILN_OK;
	if (pp->defer < 0 && !pp->wg) {
		int none;
		kiln_status st = wgrad_build(pp, &none);
		if (st) /* mid-run: a warning, the run goes on without */
			kiln_log(KILN_LOG_WARN, "pipeline", "[pipeline] defer_wgrad = auto: stays off for the run: %s",
				 kiln_last_error());
		if (st || none) {
			pp->wauto.on = 0;
			return KILN_OK;
		}
	}
	pp->defer = pp->defer > 0 ? -1 : 1;
	kiln_log(KILN_LOG_INFO, "pipeline", "[pipeline] defer_wgrad = auto: %s from pipeline step %lld (the process's threads waited %.2f s a second for a CPU, %d readings of %d steps in a row %s %.2f)",
		 pp->defer > 0 ? "on" : "off", (long long)pp->wauto.step, rate, KILN_PIPE_WAUTO_IN_A_ROW,
		 KILN_PIPE_WAUTO_STEPS, pp->defer > 0 ? "above" : "at most", KILN_PIPE_WAUTO_BUSY);
	return KILN_OK;
}

kiln_status kiln_pipe_wgrad_step(struct kiln_pipe *pp)
{
	kiln_status st;
	if (!pp->defer && (st = wgrad_open(pp)))
		return st;
	pp->wauto.step++;
	if (!pp->wauto.on || ++pp->wauto.steps <= KILN_PIPE_WAUTO_STEPS)
		return KILN_OK;
	pp->wauto.steps = 1;
	return wauto_read(pp);
}

kiln_status kiln_pipe_wgrad_backward(struct kiln_pipe *pp, struct kiln_plan *p, int s, int j,
				     const void *x, const void *y, void *metrics)
{
	kiln_status st;
	if (!pp->defer && (st = wgrad_open(pp)))
		return st;
	struct pipe_wgrad *w = pp->wg;
	if (pp->defer < 0 || !w->n[s])
		return kiln_plan_backward_range(p, pp->lo[s], pp->hi[s], x, y, metrics, pp->sst[s], NULL);
	const struct kiln_wdefer df = { w->side[s], w->ws[s], w->ws_bytes,
					pp->wkeep ? NULL : w->ring[s] + (size_t)(j % nrec(pp, s)) * w->rec[s],
					w->off };
	if ((st = kiln_plan_backward_range(p, pp->lo[s], pp->hi[s], x, y, metrics, pp->sst[s], &df)))
		return st;
	/* the end of micro-batch j's group: the side runs one at a time */
	return kiln_device_event_record(sdev(pp, s), w->ev[s][j], w->side[s]);
}

kiln_status kiln_pipe_wgrad_drain(struct kiln_pipe *pp, int s)
{
	if (pp->defer <= 0 || !pp->wg->n[s])
		return KILN_OK;
	return kiln_device_stream_wait(sdev(pp, s), pp->sst[s], pp->wg->ev[s][pp->M - 1]);
}

kiln_status kiln_pipe_wgrad_after(struct kiln_pipe *pp, int s, int j)
{
	const int lag = pp->P - 1 - s;
	if (pp->defer <= 0 || !pp->wg->n[s] || j - lag < 0)
		return KILN_OK;
	return kiln_device_stream_wait(sdev(pp, s), pp->sst[s], pp->wg->ev[s][j - lag]);
}
