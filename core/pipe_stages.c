/* core/pipe_stages.c - placement: which pipeline stage each layer runs on,
 * from [layer.X] stage or [model] stages, checked against the graph. */
#include "pipeline.h"
#include "../plugins/common/c_locale.h" /* common_snprintf_c */
#include <ctype.h>
#include <math.h> /* HUGE_VAL */

/* [layer.X] stage: each layer's own, else the previous layer's. */
static kiln_status stages_from_layers(struct kiln_model *m, int *stage, int *any)
{
	int64_t prev = 0;
	*any = 0;
	for (int i = 0; i < m->n_layers; i++) {
		int64_t s = prev;
		kiln_status st = kiln_config_get_int(m->cfg, m->layers[i].section, "stage", &s);
		if (st && st != KILN_ENOTFOUND)
			return st;
		if (!st)
			*any = 1;
		stage[i] = (int)s;
		prev = s;
	}
	return KILN_OK;
}

/* One name of [model] stages, trimmed, at *p up to the next ',' '|' or
 * the end: its layer index (KILN_ECONFIG when there is none). */
static kiln_status stage_name(struct kiln_model *m, const char **p, int *layer)
{
	const char *s = *p, *e;
	while (isspace((unsigned char)*s))
		s++;
	e = s;
	while (*e && *e != ',' && *e != '|')
		e++;
	*p = e;
	while (e > s && isspace((unsigned char)e[-1]))
		e--;
	char name[256];
	int n = (int)(e - s);
	if (n <= 0 || n >= (int)sizeof name)
		return kiln_error(KILN_ECONFIG, "%s: [model] stages: expected a layer name at '%s'",
				  kiln_config_where(m->cfg, "model", "stages"), s);
	memcpy(name, s, (size_t)n);
	name[n] = 0;
	if ((*layer = kiln_model_find_layer(m, m->n_layers, name)) < 0)
		return kiln_error(KILN_ECONFIG, "%s: [model] stages: no layer '%s'",
				  kiln_config_where(m->cfg, "model", "stages"), name);
	return KILN_OK;
}

/* The error for stage k (its text from `text` to the next '|') naming
 * more than two layers: it names its first and last alone. */
static kiln_status too_many_names(const char *where, int k, const char *text)
{
	const int n = (int)strcspn(text, "|");
	int names = 1;
	for (int i = 0; i < n; i++)
		names += text[i] == ',';
	while (isspace((unsigned char)*text))
		text++;
	int len = (int)strcspn(text, "|");
	while (len > 0 && isspace((unsigned char)text[len - 1]))
		len--;
	return kiln_error(KILN_ECONFIG, "%s: [model] stages: stage %d is '%.*s', %d layer names: a stage names its first and last layer (`first, last`, the layers between them included) or one layer, the stages separated by '|' (e.g. `stages = flat, r1 | fc2, loss`)",
			  where, k, len > 120 ? 120 : len, text, names);
}

/* [model] stages = first, last | first, last | ...: stage k runs layers
 * first..last; the groups tile the layers in file order. */
static kiln_status stages_from_model(struct kiln_model *m, const char *v, int *stage)
{
	const char *where = kiln_config_where(m->cfg, "model", "stages");
	const char *p = v;
	int next = 0, k = 0;
	kiln_status st;
	while (*p) {
		int first, last;
		const char *text = p; /* this stage's, for a message */
		if ((st = stage_name(m, &p, &first)))
			return st;
		last = first;
		if (*p == ',' && (++p, (st = stage_name(m, &p, &last))))
			return st;
		if (*p && *p != '|')
			return too_many_names(where, k, text);
		/* a '|' with no stage after it is refused as one before the
		 * first or between two (before session 38 it was ignored) */
		if (*p && !p[1 + strspn(p + 1, " \t")])
			return kiln_error(KILN_ECONFIG, "%s: [model] stages: expected a layer name after the last '|' (a trailing '|' names no stage)",
					  where);
		if (*p)
			p++;
		if (first != next || last < first)
			return kiln_error(KILN_ECONFIG, "%s: [model] stages: stage %d must run from layer '%s' (the one after the previous stage) to a later layer, in file order",
					  where, k, next < m->n_layers ? m->layers[next].name : "(none left)");
		if (k >= KILN_PIPE_MAX_STAGES)
			return kiln_error(KILN_ECONFIG, "%s: [model] stages: more than %d stages", where,
					  KILN_PIPE_MAX_STAGES);
		for (int i = first; i <= last; i++)
			stage[i] = k;
		next = last + 1;
		k++;
	}
	if (next != m->n_layers)
		return kiln_error(KILN_ECONFIG, "%s: [model] stages: layer '%s' and those after it are in no stage",
				  where, m->layers[next].name);
	return KILN_OK;
}

/* [model] stages = auto[:P]: P from the value, else [dist] pipeline,
 * else the number of [run] devices. */
static kiln_status auto_count(struct kiln_model *m, const char *v, int *P)
{
	const char *where = kiln_config_where(m->cfg, "model", "stages");
	int64_t dp = 1;
	int nd = 0;
	kiln_status st;
	*P = 0;
	if (v[4] == ':') {
		char *end = NULL;
		long n = strtol(v + 5, &end, 10);
		while (end && isspace((unsigned char)*end))
			end++;
		if (end == v + 5 || !end || *end || n < 1 || n > KILN_PIPE_MAX_STAGES)
			return kiln_error(KILN_ECONFIG, "%s: [model] stages = %s: expected `auto` or `auto:P`, P in 1..%d",
					  where, v, KILN_PIPE_MAX_STAGES);
		*P = (int)n;
		return KILN_OK;
	}
	if (v[4])
		return kiln_error(KILN_ECONFIG, "%s: [model] stages = %s: expected `auto` or `auto:P`",
				  where, v);
	if ((st = kiln_config_get_int(m->cfg, "dist", "pipeline", &dp)) && st != KILN_ENOTFOUND)
		return st;
	if (dp > 1) {
		*P = dp > KILN_PIPE_MAX_STAGES ? KILN_PIPE_MAX_STAGES + 1 : (int)dp;
		return KILN_OK;
	}
	if ((st = kiln_pipe_devices_count(m->cfg, &nd)))
		return st;
	if (nd < 2)
		return kiln_error(KILN_ECONFIG, "%s: [model] stages = auto: how many stages? Set [dist] pipeline = P or [run] devices (one per stage), or write `auto:P`",
				  where);
	*P = nd;
	return KILN_OK;
}

double kiln_pipe_layer_cost(const struct kiln_pipe_layer_est *l, double flops_per_byte)
{
	/* the forward reads x and W and writes y (an epilogue writes
	 * nothing of its own); the input's gradient reads dy, x and W and
	 * writes dx; the parameters' reads dy and x, and reads and writes dW */
	double bytes = l->epilogue ? 0 : l->in_bytes + l->out_bytes + l->param_bytes;
	if (l->dx)
		bytes += 2 * l->in_bytes + l->out_bytes + l->param_bytes;
	if (l->own)
		bytes += l->in_bytes + l->out_bytes + 2 * l->param_bytes;
	return 1 + l->flops * (1 + l->dx + l->own) + (flops_per_byte > 0 ? flops_per_byte * bytes : 0);
}

/* The bytes a sample of layer i's inputs (the data: the sample's), from
 * the summary's outputs at batch 1. */
static double input_bytes(const struct kiln_model *m, const struct kiln_summary *s, int i)
{
	double b = 0;
	for (int k = 0; k < m->layers[i].n_in; k++) {
		const int src = m->layers[i].in[k];
		if (src < 0)
			b += (double)kiln_tensor_bytes(&m->sample);
		else if (src < s->n_layers)
			b += s->layers[src].is_view ? input_bytes(m, s, src)
						    : (double)kiln_tensor_bytes(&s->layers[src].out);
	}
	return b;
}

/* The rows of one micro-batch ([train] batch / [pipeline] micro_batches,
 * at least 1): a layer's parameters are read once a pass of them. */
static double micro_rows(const struct kiln_model *m)
{
	int64_t batch = 1, M = 1;
	if (kiln_config_get_int(m->cfg, "train", "batch", &batch) || batch < 1)
		batch = 1;
	if (kiln_config_get_int(m->cfg, "pipeline", "micro_batches", &M) || M < 1)
		M = 1;
	return batch / M > 1 ? (double)(batch / M) : 1.0;
}

/* Each layer's estimated cost a sample (m->stage_cost, counted once),
 * kiln_pipe_layer_cost of: its forward's FLOPs at batch 1
 * (kiln_model_summary: the device prepares nothing); its input's
 * gradient computed when a layer before it has trainable parameters (else
 * the backward computes none: the first layers after the data); its own
 * trainable parameters' gradient; the bytes of its inputs and output a
 * sample (a view's: none; the data's: the sample's) and of its parameters
 * and buffers over a micro-batch's rows (read once a micro-batch); a ReLU
 * of epi[i] (fused into the layer before it) no forward pass of its own;
 * and [model] stages_flops_per_byte. */
static kiln_status auto_costs(struct kiln_model *m, const char *epi)
{
	struct kiln_summary s;
	double fpb = 0;
	if (m->stage_cost)
		return KILN_OK;
	kiln_status st = kiln_config_get_float(m->cfg, "model", "stages_flops_per_byte", &fpb);
	if (st && st != KILN_ENOTFOUND)
		return st;
	st = kiln_model_summary(m, 1, &s);
	if (st)
		return kiln_error_wrap(st, "%s: [model] stages = auto: counting the layers' FLOPs",
				       kiln_config_where(m->cfg, "model", "stages"));
	double *c = calloc((size_t)(m->n_layers ? m->n_layers : 1), sizeof *c);
	if (!c) {
		kiln_summary_free(&s);
		return kiln_error(KILN_ENOMEM, "out of memory");
	}
	/* g[i]: a gradient flows back from layer i's output (it or a layer
	 * before it has trainable parameters) */
	char *g = calloc((size_t)(m->n_layers ? m->n_layers : 1), 1);
	if (!g) {
		free(c);
		kiln_summary_free(&s);
		return kiln_error(KILN_ENOMEM, "out of memory");
	}
	const double rows = micro_rows(m);
	for (int i = 0; i < m->n_layers; i++) {
		const struct kiln_summary_layer *sl = i < s.n_layers ? &s.layers[i] : NULL;
		struct kiln_pipe_layer_est e = { 0 };
		e.own = sl && sl->trainable > 0;
		for (int k = 0; k < m->layers[i].n_in; k++)
			e.dx |= m->layers[i].in[k] >= 0 && g[m->layers[i].in[k]];
		e.flops = s.no_flops || !sl ? 0 : sl->flops;
		if (sl && !sl->is_view) {
			e.in_bytes = input_bytes(m, &s, i);
			e.out_bytes = (double)kiln_tensor_bytes(&sl->out);
			e.param_bytes = 4.0 * (double)(sl->trainable + sl->frozen + sl->buffers) / rows;
		}
		e.epilogue = epi && epi[i];
		c[i] = kiln_pipe_layer_cost(&e, fpb);
		g[i] = (char)(e.own || e.dx);
	}
	free(g);
	kiln_summary_free(&s);
	m->stage_cost = c;
	m->stage_fpb = fpb;
	return KILN_OK;
}

/* One pass of kiln_pipe_balance's dynamic programme over the prefix sums
 * pre[0..n], W = n + 1 columns a row: best[k W + j] the least objective of
 * layers 0..j-1 in k stages, cut[k W + j] where the k-th of them starts.
 * cap < 0: the objective is the busiest stage's cost; else every stage's
 * cost at most cap (BALANCE_TIE above it) and the objective the sum of their squares (HUGE_VAL:
 * none such); no stage starts at a layer i of nocut[i] (NULL: none). */
/* Cuts whose busiest stage is within this share of the least count as its
 * equals: costs are estimates, and the 1 each layer counts (a view's cost)
 * must not decide the cut, e.g. put a flatten alone on a stage to save 1 of
 * a million in the busiest (check_pipeline test_balance_tie). */
#define BALANCE_TIE 1e-3

static void balance_pass(const double *pre, int n, int P, const char *nocut, double cap,
			 double *best, int *cut)
{
	const size_t W = (size_t)n + 1;
	const double lim = cap * (1 + BALANCE_TIE);
	for (int j = 0; j <= n; j++) {
		best[W + (size_t)j] = cap < 0 ? pre[j] : pre[j] <= lim ? pre[j] * pre[j] : HUGE_VAL;
		cut[W + (size_t)j] = 0;
	}
	for (int k = 2; k <= P; k++)
		for (int j = k; j <= n; j++) {
			double b = HUGE_VAL;
			int at = k - 1;
			/* the first start of the least: the same cut on every rank */
			for (int i = k - 1; i < j; i++) {
				if (nocut && nocut[i])
					continue; /* no stage may start at layer i */
				const double prev = best[(size_t)(k - 1) * W + (size_t)i], own = pre[j] - pre[i];
				double v;
				if (cap < 0)
					v = prev > own ? prev : own;
				else
					v = own <= lim ? prev + own * own : HUGE_VAL;
				if (v < b)
					b = v, at = i;
			}
			best[(size_t)k * W + (size_t)j] = b, cut[(size_t)k * W + (size_t)j] = at;
		}
}

kiln_status kiln_pipe_balance(const double *cost, int n, int P, const char *nocut, int *stage)
{
	if (P < 1 || n < P)
		return kiln_error(KILN_EINVAL, "pipeline balance: %d layers cannot make %d stages (one layer a stage at least)",
				  n, P);
	const size_t W = (size_t)n + 1;
	double *pre = malloc(W * sizeof *pre);
	double *best = malloc((size_t)(P + 1) * W * sizeof *best);
	int *cut = malloc((size_t)(P + 1) * W * sizeof *cut);
	if (!pre || !best || !cut) {
		free(pre), free(best), free(cut);
		return kiln_error(KILN_ENOMEM, "out of memory");
	}
	pre[0] = 0;
	for (int i = 0; i < n; i++)
		pre[i + 1] = pre[i] + (cost[i] > 0 ? cost[i] : 0);
	/* the least busiest stage; then, of the cuts with no stage above it,
	 * the one whose stages' costs are most even (least sum of squares),
	 * so that the stages that do not bound the step share the rest */
	balance_pass(pre, n, P, nocut, -1, best, cut);
	double most = best[(size_t)P * W + (size_t)n];
	if (most == HUGE_VAL) { /* no cut avoids nocut's layers */
		nocut = NULL;
		balance_pass(pre, n, P, NULL, -1, best, cut);
		most = best[(size_t)P * W + (size_t)n];
	}
	balance_pass(pre, n, P, nocut, most, best, cut);
	for (int k = P, j = n; k >= 1; k--) {
		const int i = cut[(size_t)k * W + (size_t)j];
		for (int l = i; l < j; l++)
			stage[l] = k - 1;
		j = i;
	}
	free(pre), free(best), free(cut);
	return KILN_OK;
}

/* Log the auto cut once: as a [model] stages value (pasteable), then
 * each stage's estimated cost (FLOPs and bytes, in FLOPs) and share. */
static void auto_say(struct kiln_model *m, const int *stage, int P)
{
	char cut[2048], costs[1024];
	size_t k = 0, c = 0;
	double tot = 0, cost[KILN_PIPE_MAX_STAGES] = { 0 }, most = 0;
	if (m->stage_said)
		return;
	m->stage_said = 1;
	for (int i = 0; i < m->n_layers; i++)
		cost[stage[i]] += m->stage_cost[i], tot += m->stage_cost[i];
	cut[0] = costs[0] = 0;
	for (int s = 0; s < P; s++) {
		int lo = m->n_layers, hi = 0;
		for (int i = 0; i < m->n_layers; i++)
			if (stage[i] == s)
				hi = i, lo = i < lo ? i : lo;
		if (cost[s] > most)
			most = cost[s];
		if (k < sizeof cut)
			k += (size_t)snprintf(cut + k, sizeof cut - k, "%s%s%s%s", s ? " | " : "",
					      m->layers[lo].name, hi > lo ? ", " : "",
					      hi > lo ? m->layers[hi].name : "");
		if (c < sizeof costs)
			c += (size_t)common_snprintf_c(costs + c, sizeof costs - c, "%s%.4g (%.2f%%)", s ? " | " : "",
					      cost[s] / 1e6, tot > 0 ? 100 * cost[s] / tot : 0.0);
	}
	kiln_log(KILN_LOG_INFO, "pipeline", "[model] stages = auto: %s (estimated MFLOP a sample: the forward's, again for each gradient the backward computes, and %g a byte the passes move ([model] stages_flops_per_byte): %s; the busiest stage %.2f%% over the mean)",
		 cut, m->stage_fpb > 0 ? m->stage_fpb : 0.0, costs, tot > 0 ? 100 * (most * P / tot - 1) : 0.0);
}

/* [model] stages = auto[:P]: the cut into P runs of layers whose busiest
 * stage's estimated cost (FLOPs and bytes moved) is least
 * (kiln_pipe_balance over auto_costs),
 * a ReLU fused into the layer before it kept on that layer's stage. */
static kiln_status stages_auto(struct kiln_model *m, const char *v, int *stage)
{
	int P;
	kiln_status st;
	if ((st = auto_count(m, v, &P)))
		return st;
	if (P > m->n_layers || P > KILN_PIPE_MAX_STAGES)
		return kiln_error(KILN_ECONFIG, "%s: [model] stages = auto: %d stages for %d layers",
				  kiln_config_where(m->cfg, "model", "stages"), P, m->n_layers);
	/* no cut between a layer and the ReLU that [run] fuse makes its
	 * epilogue (fusion stops at a stage boundary: the ReLU would run
	 * alone, a pass over its tensor each way) */
	char *nocut = calloc((size_t)m->n_layers, 1);
	if (!nocut)
		return kiln_error(KILN_ENOMEM, "out of memory");
	for (int i = 0; m->fuse && i + 1 < m->n_layers; i++)
		nocut[i + 1] = kiln_model_only_consumer(m, i) == i + 1 && m->layers[i + 1].n_in == 1 &&
			       !strcmp(m->layers[i + 1].type->name, "relu");
	if (!(st = auto_costs(m, nocut)))
		st = kiln_pipe_balance(m->stage_cost, m->n_layers, P, nocut, stage);
	free(nocut);
	if (st)
		return st;
	auto_say(m, stage, P);
	return KILN_OK;
}

/* Stages follow the layers' file order (a stage is a run of layers), none
 * is empty, and no layer reads a later stage's output. */
static kiln_status stages_check(struct kiln_model *m, const int *stage)
{
	for (int i = 0; i < m->n_layers; i++) {
		const char *where = kiln_config_where(m->cfg, m->layers[i].section, "stage");
		if (stage[i] < 0 || stage[i] >= KILN_PIPE_MAX_STAGES)
			return kiln_error(KILN_ECONFIG, "%s: layer '%s': stage %d is not in 0..%d",
					  where, m->layers[i].name, stage[i], KILN_PIPE_MAX_STAGES - 1);
		int prev = i ? stage[i - 1] : 0;
		if (stage[i] < prev || stage[i] > prev + 1)
			return kiln_error(KILN_ECONFIG, "%s: layer '%s' is on stage %d after a layer on stage %d: stages must follow the layers' file order, each next stage one more",
					  where, m->layers[i].name, stage[i], prev);
		for (int k = 0; k < m->layers[i].n_in; k++) {
			int src = m->layers[i].in[k];
			if (src >= 0 && stage[src] > stage[i])
				return kiln_error(KILN_ECONFIG, "%s: layer '%s' (stage %d) reads '%s' of a later stage (%d)",
						  where, m->layers[i].name, stage[i],
						  m->layers[src].name, stage[src]);
		}
	}
	return KILN_OK;
}

kiln_status kiln_pipe_read_stages(struct kiln_model *m)
{
	const char *v = kiln_config_get(m->cfg, "model", "stages");
	int *stage = calloc((size_t)(m->n_layers ? m->n_layers : 1), sizeof(int));
	int any = 0;
	kiln_status st;
	free(m->stage);
	m->stage = NULL;
	m->n_stages = 1;
	if (!stage)
		return kiln_error(KILN_ENOMEM, "out of memory");
	if ((st = stages_from_layers(m, stage, &any)))
		goto fail;
	if (v && *v) {
		if (any) {
			st = kiln_error(KILN_ECONFIG, "%s: [model] stages and [layer.X] stage both place layers: use one",
					kiln_config_where(m->cfg, "model", "stages"));
			goto fail;
		}
		/* (a layer may be named auto...: `auto` alone or `auto:`) */
		if (!strcmp(v, "auto") || !strncmp(v, "auto:", 5) ? (st = stages_auto(m, v, stage))
								  : (st = stages_from_model(m, v, stage)))
			goto fail;
	}
	if ((st = stages_check(m, stage)))
		goto fail;
	int P = m->n_layers ? stage[m->n_layers - 1] + 1 : 1;
	if (P == 1) {
		free(stage);
		return KILN_OK;
	}
	m->stage = stage;
	m->n_stages = P;
	return KILN_OK;
fail:
	free(stage);
	return st;
}
