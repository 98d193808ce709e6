/* core/pipe_memory.c - `kiln memory` for a pipeline: per stage, its
 * layers, parameters and the activation bytes of one micro-batch (its
 * layers' outputs, saved state and gradients, and the receive buffers of
 * the tensors it reads from earlier stages), and how many micro-batches'
 * worth each schedule keeps alive on it. */
#include "pipe_impl.h" /* kiln_pipe_wgrad_record */
#include "checkpoint.h" /* KILN_CKPT_PIECE_BYTES */
#include "dist.h" /* kiln_dist_env_read */
#include <stdio.h>

static double mib(size_t b) { return (double)b / 1048576.0; }

static size_t store_b(const struct kiln_plan *p, int s)
{
	return s >= 0 ? p->store[s].bytes : 0;
}

/* The bytes of one micro-batch on stage s of plan p (unpacked). */
static size_t stage_act_bytes(const struct kiln_plan *p, int s)
{
	const struct kiln_model *m = p->m;
	size_t t = 0;
	for (int i = 0; i < m->n_layers; i++) {
		const struct plan_node *nd = &p->nodes[i];
		if (kiln_pipe_stage(m, i) != s)
			continue;
		if (kiln_plan_root_y(p->nodes, m, i) == i)
			t += store_b(p, nd->ystore) + store_b(p, nd->gstore);
		t += store_b(p, nd->sstore);
	}
	for (int e = 0; e < p->n_xfer; e++)
		if (p->xfer[e].to == s)
			t += store_b(p, p->xfer[e].recv) + store_b(p, p->xfer[e].grecv) +
			     store_b(p, p->xfer[e].gtmp);
	return t;
}

/* ZeRO-1 with [dist] pipeline: a checkpoint is not streamed in pieces
 * (kiln_dist_pipe_ckpt_streams is 0): rank 0 gathers the whole optimizer
 * state, every slot of every trainable float, into a buffer of its own
 * while it writes (kiln_dist_pipe_gather_state's d->zfull), a transient
 * the table's columns do not hold; the other ranks gather through their
 * gradients, nothing more.  Before session 34 the report left it out. */
static kiln_status zero_ckpt_print(const struct kiln_model *m, FILE *f)
{
	int64_t zero = 0, P = 1;
	kiln_status st = kiln_config_get_int(m->cfg, "dist", "zero", &zero);
	if (!st)
		st = kiln_config_get_int(m->cfg, "dist", "pipeline", &P);
	if (st && st != KILN_ENOTFOUND)
		return st;
	if (zero != 1 || P <= 1 || !m->state_slots || !m->n_trainable)
		return KILN_OK;
	const size_t b = (size_t)m->state_slots * m->n_trainable * sizeof(float);
	fprintf(f, "  checkpoint with [dist] zero = 1 and pipeline = %lld: rank 0 gathers the whole optimizer state (%d slot(s) x %zu floats), +%.3f MiB (%zu bytes) over its training peak while it writes; the other ranks gather through their gradients (nothing more)\n",
		(long long)P, m->state_slots, m->n_trainable, mib(b), b);
	return KILN_OK;
}

/* 1: a run of this config falls back from [pipeline] defer_wgrad = 1
 * (core/pipe_wgrad.c, why_not: what the config tells before the run). */
static int wgrad_falls_back(const struct kiln_model *m)
{
	struct kiln_dist_env env;
	int64_t P = 1;
	int async = 1;
	const char *pr = kiln_config_get(m->cfg, "run", "precision");
	const char *as = kiln_config_get(m->cfg, "plugin.cpu", "async");
	kiln_config_get_int(m->cfg, "dist", "pipeline", &P);
	if (as && strcmp(as, "auto") && kiln_config_get_bool(m->cfg, "plugin.cpu", "async", &async))
		async = 1;
	return P > 1 || (!kiln_dist_env_read(&env) && env.world > 1) || m->n_tie_elems ||
	       (pr && !strcmp(pr, "fp16")) || !async;
}

/* defer_wgrad = 1: the activation sets of one process's schedule, as
 * kiln_pipe_open makes them with and without the deferred passes reading
 * the plans' own buffers (micro-batch j's set free after stage 0's
 * backward of j + P - 1); 0 where the schedule cannot be made. */
static int wkeep_sets(const struct kiln_model *m, int64_t M, int early, int *plain)
{
	const char *sched = kiln_config_get(m->cfg, "pipeline", "schedule");
	const int kind = sched && !strcmp(sched, "gpipe") ? KILN_PIPE_GPIPE : KILN_PIPE_1F1B;
	const int P = m->n_stages;
	struct kiln_pipe_action *act = malloc(sizeof *act * 2 * (size_t)P * (size_t)M);
	int ticks, K = 0;
	kiln_status st = act ? kiln_pipe_schedule(kind, P, (int)M, kind == KILN_PIPE_1F1B ? early : 0,
						   act, &ticks, plain)
			     : KILN_ENOMEM;
	if (!st)
		K = kiln_pipe_sets_lagged(act, P, (int)M, P - 1, *plain);
	free(act);
	return K;
}

/* [pipeline] defer_wgrad = 1 or auto (core/pipe_wgrad.c) with [run]
 * devices: 1, no copies: the plans keep what the deferred passes read
 * (kiln_plan.wkeep) and the schedule one more activation set per stage
 * of lag (wkeep_sets); auto (copies, a ring made when contention first
 * turns it on): each stage's records of its deferred layers, min(M,
 * P - s) micro-batches' on stage s.  Both: a workspace of the plan's on
 * each stage that has a deferred layer.  Nothing where the run falls
 * back (no layer to defer, tied weights, data parallelism, ...). */
static void wgrad_print(const struct kiln_model *m, const struct kiln_plan *p, int64_t M, int early,
			FILE *f)
{
	const char *dv = kiln_config_get(m->cfg, "pipeline", "defer_wgrad");
	const int is_auto = !dv || !strcmp(dv, "auto");
	int on = 1;
	if (!is_auto && (kiln_config_get_bool(m->cfg, "pipeline", "defer_wgrad", &on) || !on))
		return;
	const char *devs = kiln_config_get(m->cfg, "run", "devices");
	if (!devs || !*devs || wgrad_falls_back(m))
		return;
	const int P = m->n_stages;
	size_t b[KILN_PIPE_MAX_STAGES] = { 0 };
	int with = 0;
	for (int s = 0; s < P && s < KILN_PIPE_MAX_STAGES; s++) {
		for (int i = 0; i < m->n_layers; i++)
			if (kiln_pipe_stage(m, i) == s)
				b[s] += kiln_pipe_wgrad_record(m, p, i);
		with += b[s] > 0;
	}
	if (!with)
		return;
	int plain = 0, sets = is_auto ? 0 : wkeep_sets(m, M, early, &plain);
	if (sets) {
		fprintf(f, "  deferred weight gradients ([pipeline] defer_wgrad = 1, stages on [run] devices): no copies, the plans keep each deferred linear layer's input and output gradient (and output, with a fused ReLU) to the schedule's end: %d activation sets instead of %d, and a workspace of %.3f MiB on each of the %d stages with one\n",
			sets, plain, mib(kiln_align_up(p->ws_bytes)), with);
		return;
	}
	fprintf(f, "  deferred weight gradients ([pipeline] defer_wgrad%s, stages on [run] devices): min(M, P - s) micro-batches' copies of each linear layer's input and output gradient (and output, with a fused ReLU) on stage s, and a workspace of %.3f MiB on each of the %d stages with one:",
		is_auto ? " = auto, once the CPUs' contention turns it on" : "", mib(kiln_align_up(p->ws_bytes)), with);
	for (int s = 0; s < P && s < KILN_PIPE_MAX_STAGES; s++) {
		const int64_t n = P - s < M ? P - s : M;
		fprintf(f, " stage %d %.3f MiB%s", s, mib(b[s] * (size_t)n), s + 1 < P ? "," : "\n");
	}
}

kiln_status kiln_pipe_memory_print(struct kiln_model *m, int64_t batch, FILE *f)
{
	int64_t M = 1, early = 0;
	kiln_status st = kiln_config_get_int(m->cfg, "pipeline", "early_forwards", &early);
	if (st && st != KILN_ENOTFOUND)
		return st;
	st = kiln_config_get_int(m->cfg, "pipeline", "micro_batches", &M);
	if (st && st != KILN_ENOTFOUND)
		return st;
	if (batch % M)
		return kiln_error(KILN_ECONFIG, "[train] batch = %lld is not a multiple of [pipeline] micro_batches = %lld",
				  (long long)batch, (long long)M);
	struct kiln_plan_opts o = { .training = 1, .dry = 1 };
	struct kiln_plan *p = NULL;
	m->plan_staged = 1;
	st = kiln_model_plan_ex(m, batch / M, &o, &p);
	m->plan_staged = 0;
	if (st)
		return st;
	const int P = m->n_stages;
	fprintf(f, "\npipeline: %d stages, %lld micro-batches of %lld (activations per stage without lifetime packing)\n",
		P, (long long)M, (long long)(batch / M));
	fprintf(f, "  %-5s %-28s %12s %12s %14s %12s %12s %12s %12s\n", "stage", "layers",
		"params MiB", "grads MiB", "per micro MiB", "gpipe MiB", "1f1b MiB", "rank MiB",
		"optim MiB");
	for (int s = 0; s < P; s++) {
		int lo = -1, hi = -1;
		size_t par = 0;
		for (int i = 0; i < m->n_layers; i++)
			if (kiln_pipe_stage(m, i) == s)
				hi = i, lo = lo < 0 ? i : lo;
		for (int i = 0; i < m->n_params; i++)
			if (!m->params[i].buffer && kiln_pipe_param_stage(m, &m->params[i]) == s)
				par += (size_t)m->params[i].numel * 4;
		size_t a = stage_act_bytes(p, s);
		/* micro-batches alive on stage s: gpipe all M, 1f1b min(P - s, M),
		 * with early forwards more on every stage but the last */
		const int64_t want = P - s + (s < P - 1 ? early : 0);
		const int64_t alive = want < M ? want : M;
		char names[160];
		snprintf(names, sizeof names, "%s..%s", m->layers[lo].name, m->layers[hi].name);
		/* (the gradients: the stage's and a slot per stage's norm; a
		 * rank: those, the optimizer state and 1f1b's activations) */
		const size_t held = par + (par + (size_t)P * 4) + par * (size_t)m->state_slots;
		fprintf(f, "  %-5d %-28s %12.3f %12.3f %14.3f %12.3f %12.3f %12.3f %12.3f\n", s, names,
			mib(par), mib(par + (size_t)P * 4), mib(a), mib(a * (size_t)M),
			mib(a * (size_t)alive), mib(held + a * (size_t)alive),
			mib(par * (size_t)m->state_slots));
	}
	fprintf(f, "  (params, grads and optim MiB: what a rank of the stage holds with [dist] pipeline, its stage's alone, from start-up on; optim: %d slot(s) of [train] optimizer = %s. rank MiB: those and 1f1b's activations, a stage's rank's peak in training and per-stage evaluation (besides its evaluation plans, staging and workspaces). A checkpoint is written by rank 0 with each stage's slice streamed to it in pieces (+%.3f MiB; not with ZeRO-1: the line below), keep_best's too (since session 13), a resume and [model] init_from read each rank's stage alone. The parameters and gradients stay whole on every rank with an optimizer that does not shard, ZeRO-1, bf16/fp16 compute, frozen parameters or a weight tied across stages, and at start-up with an llm.c [model] init_from)\n",
		m->state_slots, m->optim_name, mib(KILN_CKPT_PIECE_BYTES));
	fprintf(f, "  (1f1b: min(P - s, M) micro-batches alive on stage s, %lld more with [pipeline] early_forwards on all but the last, once stages have devices of their own; in one process every stage keeps that of stage 0 in whole-model sets today)\n",
		(long long)early);
	wgrad_print(m, p, M, (int)early, f);
	kiln_plan_free(p);
	return zero_ckpt_print(m, f);
}
