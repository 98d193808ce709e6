/* core/optim/optim.c - the model's optimizer: [train] optimizer names an
 * optimizer table (struct kiln_optim_ops, plugin.h) in the registry, a
 * built-in (core/optim/optims.c) or a plugin's, and this file gives it the
 * buffers: its state (state_slots x n_trainable floats), the [train]
 * no_decay weight-decay multiplier, the tensor offsets, the optimizer's
 * step count and the workspace, all in device memory; and the list of the
 * buffers that define training state (kiln_model_state_buffers).
 *
 * One step is two launches or more on the compute stream: COUNTER_ADD
 * advances opt_step_d (the optimizer reads the 1-based number of the step
 * it takes), then the optimizer's own ops (one fused op for the built-ins)
 * read lr and the step count from device memory.  Nothing per step comes
 * from the host, so one prepared plan serves the whole run.  When a finite
 * flag gates the step ([train] skip_nonfinite, loss scaling), the same flag
 * gates the counter: a skipped step is not counted, as PyTorch's
 * GradScaler skips optimizer.step() and with it Adam's step count (and the
 * schedule, which reads the same count).
 */
#include "../graph.h"

#include <fnmatch.h>  /* [train] no_decay patterns */
#include <stdio.h>

/* ---- configuration ------------------------------------------------------
 * The optimizer is opened at create, so a bad value is reported before
 * anything is allocated, and its state is allocated with the parameters. */

/* The k-th (from 0) non-empty pattern of a comma-separated list, trimmed,
 * into buf[0..n); 0 when there are fewer. */
static int nth_pattern(const char *list, int k, char *buf, size_t n)
{
	for (const char *c = list; c && *c;) {
		size_t len = strcspn(c, ",");
		while (len && (*c == ' ' || *c == '\t'))
			c++, len--;
		while (len && (c[len - 1] == ' ' || c[len - 1] == '\t'))
			len--;
		if (len && k-- == 0) {
			snprintf(buf, n, "%.*s", (int)len, c);
			return 1;
		}
		c += strcspn(c, ",");
		c += *c == ',';
	}
	return 0;
}

/* Does parameter `name` match one of the patterns of `list`? */
static int pattern_match(const char *list, const char *name)
{
	char pat[256];
	for (int k = 0; nth_pattern(list, k, pat, sizeof pat); k++)
		if (!fnmatch(pat, name, 0))
			return 1;
	return 0;
}

/* [train] no_decay: the patterns, or NULL when there are none (no groups:
 * the op gets no multiplier and costs nothing extra). */
static const char *no_decay_list(const struct kiln_config *cfg)
{
	const char *list = kiln_config_get(cfg, "train", "no_decay");
	for (const char *c = list; c && *c; c++)
		if (*c != ',' && *c != ' ' && *c != '\t')
			return list;
	return NULL;
}

/* Whether the list "a, b, c" holds `name` as a whole item ("adam" is
 * not in "sgd, adamw"). */
static int list_has(const char *list, const char *name)
{
	const size_t len = strlen(name);
	for (const char *c = list; (c = strstr(c, name)); c++)
		if ((c == list || c[-1] == ' ') && (c[len] == ',' || !c[len]))
			return 1;
	return 0;
}

/* The registry's optimizers as "sgd, adam, adamw, lamb, ..." into buf. */
static const char *optim_names(const struct kiln_registry *reg, char *buf, size_t n)
{
	size_t k = 0;
	buf[0] = 0;
	for (int i = 0; i < kiln_registry_plugin_count(reg) && k < n; i++) {
		struct kiln_plugin_info pi = KILN_PLUGIN_INFO_INIT;
		kiln_registry_plugin_get(reg, i, &pi);
		if (pi.kind == KILN_PLUGIN_OPTIM && !list_has(buf, pi.name))
			k += (size_t)snprintf(buf + k, n - k, "%s%s", k ? ", " : "", pi.name);
	}
	return buf;
}

kiln_status kiln_optim_find(const struct kiln_config *cfg, const struct kiln_registry *reg,
			    const struct kiln_plugin **p)
{
	const char *name = kiln_config_get(cfg, "train", "optimizer");
	char names[512];
	if (!name)
		name = "sgd";
	if (!kiln_registry_find(reg, KILN_PLUGIN_OPTIM, name, p))
		return KILN_OK;
	char sug[100];
	optim_names(reg, names, sizeof names);
	return kiln_error(KILN_ECONFIG, "%s: [train] optimizer = %s: one of %s (built-in or optim plugins: `kiln plugins`)%s",
			  kiln_config_where(cfg, "train", "optimizer"), name, names,
			  kiln_suggest_choice(name, names, sug, sizeof sug));
}

kiln_status kiln_model_optim_configure(struct kiln_model *m, const struct kiln_registry *reg)
{
	const struct kiln_config *cfg = m->cfg;
	const struct kiln_plugin *p;
	const char *mode = kiln_config_get(cfg, "train", "weight_decay_mode");
	kiln_status st;
	if ((st = kiln_optim_find(cfg, reg, &p)))
		return st;
	const struct kiln_optim_ops *ops = p->ops;
	if (!ops || ops->version < KILN_OPTIM_OPS_VERSION || !ops->open || !ops->plan || !ops->step)
		return kiln_error(KILN_EPLUGIN, "optim plugin '%s': ops version %u, not %d, or a member missing (open, plan, step)",
				  p->name, ops ? ops->version : 0, KILN_OPTIM_OPS_VERSION);
	memset(&m->optim_info, 0, sizeof m->optim_info);
	if ((st = ops->open(kiln_host_table(), cfg, &m->optim_info, &m->optim_ctx)))
		return kiln_error_wrap(st, "[train] optimizer = %s", p->name);
	m->optim = ops;
	m->optim_name = p->name;
	if (m->optim_info.state_slots < 0 || m->optim_info.state_slots > KILN_OPTIM_MAX_SLOTS)
		return kiln_error(KILN_EPLUGIN, "optim plugin '%s': %d state slots (0..%d)", p->name,
				  m->optim_info.state_slots, KILN_OPTIM_MAX_SLOTS);
	if (!m->optim_info.decay_modes && mode && strcmp(mode, "decoupled") &&
	    strcmp(kiln_config_where(cfg, "train", "weight_decay_mode"), "default"))
		return kiln_error(KILN_ECONFIG, "%s: [train] weight_decay_mode = %s applies to sgd only: %s always decouples the weight decay",
				  kiln_config_where(cfg, "train", "weight_decay_mode"), mode,
				  p->name);
	for (int k = 0; k < m->optim_info.state_slots; k++)
		if (!m->optim_info.slot_names[k])
			return kiln_error(KILN_EPLUGIN, "optim plugin '%s': state slot %d has no name (kiln_optim_info.slot_names)",
					  p->name, k);
	m->state_slots = m->optim_info.state_slots;
	m->n_tensors = 0;
	for (int i = 0; i < m->n_params; i++)
		m->n_tensors += m->params[i].trainable;
	return KILN_OK;
}

kiln_status kiln_model_optim_alloc(struct kiln_model *m)
{
	const size_t n = m->n_trainable;
	kiln_status st;
	if ((st = kiln_device_alloc_named(m->dev, 64, (void **)&m->opt_step_d,
					  "the optimizer's step count")))
		return st;
	if (!n)
		return KILN_OK; /* nothing to train: no state */
	/* (the state comes with the parameters: kiln_model_alloc_whole, or a
	 * stage's alone, kiln_dist_pipe_hold) */
	if (m->optim_info.needs_offsets &&
	    (st = kiln_device_alloc_named(m->dev, (size_t)(m->n_tensors + 1) * sizeof(int64_t),
					  (void **)&m->offsets_d, "the optimizer's tensor offsets")))
		return st;
	/* (the no_decay multiplier: kiln_model_optim_prepare, the stage's
	 * alone on a rank holding its stage) */
	m->wd_groups = no_decay_list(m->cfg) != NULL;
	return KILN_OK;
}

void kiln_model_optim_free(struct kiln_model *m)
{
	kiln_model_optim_plan_free(m, m->optim_plan);
	m->optim_plan = NULL;
	kiln_device_plan_free(m->dev, m->opt_step_plan);
	kiln_device_free(m->dev, m->state_d);
	kiln_device_free(m->dev, m->wd_mult_buf);
	m->wd_mult_buf = m->wd_mult_d = NULL;
	kiln_device_free(m->dev, m->offsets_d);
	kiln_device_free(m->dev, m->opt_step_d);
	kiln_device_free(m->dev, m->optim_ws);
	if (m->optim && m->optim->close)
		m->optim->close(m->optim_ctx);
	m->optim = NULL;
	m->optim_ctx = NULL;
}

/* ---- prepare and step -------------------------------------------------- */

/* Fill the weight-decay multiplier (0 for no_decay parameters) in host[]
 * and log the groups; warn about a pattern that matches nothing. */
static void build_wd_mult(const struct kiln_model *m, const char *list, float *host)
{
	size_t nd_elems = 0;
	int nd_tensors = 0;
	for (size_t e = 0; e < m->n_trainable; e++)
		host[e] = 1.0f;
	for (int i = 0; i < m->n_params; i++) {
		const struct model_param *p = &m->params[i];
		if (!p->trainable || !pattern_match(list, p->name))
			continue;
		for (int64_t e = 0; e < p->numel; e++)
			host[p->off + (size_t)e] = 0.0f;
		nd_tensors++;
		nd_elems += (size_t)p->numel;
	}
	char pat[256];
	for (int k = 0; nth_pattern(list, k, pat, sizeof pat); k++) {
		int hit = 0;
		for (int i = 0; i < m->n_params && !hit; i++)
			hit = m->params[i].trainable && !fnmatch(pat, m->params[i].name, 0);
		if (!hit)
			kiln_log(KILN_LOG_WARN, "core", "%s: [train] no_decay pattern '%s' matches no trainable parameter (names look like '%s')",
				 kiln_config_where(m->cfg, "train", "no_decay"), pat,
				 m->n_params ? m->params[0].name : "fc1.weight");
	}
	kiln_log(KILN_LOG_INFO, "core", "no_decay: %d of %lld trainable tensors (%zu floats) get no weight decay",
		 nd_tensors, (long long)m->n_tensors, nd_elems);
}

kiln_status kiln_model_optim_prepare(struct kiln_model *m, void *stream)
{
	kiln_status st = KILN_OK, st2;
	const size_t n = m->n_trainable;
	const size_t nst = (size_t)m->state_slots * n;
	void *fill_grads = NULL, *fill_state = NULL;
	float *host = NULL;
	struct kiln_op op;

	/* the no_decay multiplier over the trainables, or over the slice a
	 * rank holding its stage alone steps (before session 12: whole);
	 * before the plans, which read whether it is there */
	if (n && m->wd_groups && !m->wd_mult_buf) {
		const size_t lo = m->held ? m->held_lo : 0, hi = m->held ? m->held_hi : n;
		if ((st = kiln_device_alloc(m->dev, (hi > lo ? hi - lo : 1) * sizeof(float),
					    (void **)&m->wd_mult_buf)))
			return st;
		m->wd_mult_d = m->wd_mult_buf - lo; /* (offsets in [lo, hi) only) */
	}
	/* a second call replaces the plans */
	kiln_model_optim_plan_free(m, m->optim_plan);
	kiln_device_plan_free(m->dev, m->opt_step_plan);
	kiln_device_free(m->dev, m->optim_ws);
	m->optim_plan = m->opt_step_plan = m->optim_ws = NULL;
	m->optim_ws_bytes = 0;
	/* the step count, gated by the same flag as the step */
	if (m->step_ok_d) {
		int64_t one = 1;
		memset(&op, 0, sizeof op);
		op.type = KILN_OP_COUNTER_ADD;
		op.flags = KILN_OPF_GATED;
		op.n_in = op.n_out = 1;
		op.i[0] = 1;
		kiln_tensor_desc_init(&op.in[0], KILN_F32, 1, &one);
		kiln_tensor_desc_init(&op.out[0], KILN_I64, 1, &one);
		if ((st = kiln_device_prepare(m->dev, &op, &m->opt_step_plan, NULL)))
			return kiln_error_wrap(st, "the optimizer's step count, gated by the finite flag");
	}
	if (n) {
		if ((st = kiln_model_optim_plan(m, n, &m->optim_plan)))
			return kiln_error_wrap(st, "[train] optimizer = %s over %zu trainable floats",
					       m->optim_name, n);
	}
	/* host staging: the multiplier, the LAMB offsets, the step count */
	size_t hb = 64;
	if (m->wd_mult_d && n * sizeof(float) > hb)
		hb = n * sizeof(float);
	if (m->offsets_d && (size_t)(m->n_tensors + 1) * sizeof(int64_t) > hb)
		hb = (size_t)(m->n_tensors + 1) * sizeof(int64_t);
	if ((st = kiln_device_host_alloc_named(m->dev, hb, (void **)&host,
					       "the optimizer's host staging (its step count, multipliers, offsets)")))
		return st;
	if (m->wd_mult_d) {
		const size_t lo = m->held ? m->held_lo : 0, hi = m->held ? m->held_hi : n;
		build_wd_mult(m, no_decay_list(m->cfg), host);
		if (hi > lo && !(st = kiln_device_copy_async(m->dev, m->wd_mult_buf, host + lo,
							     (hi - lo) * sizeof(float),
							     KILN_COPY_H2D, stream)))
			st = kiln_device_stream_sync(m->dev, stream);
	}
	if (!st && m->offsets_d) {
		/* trainable tensors are the leading parameters, in buffer order;
		 * a tensor runs to the next one's start (padding is zero in
		 * params and grads, so it adds nothing to the norms) */
		int64_t *off = (int64_t *)host, k = 0;
		for (int i = 0; i < m->n_params; i++)
			if (m->params[i].trainable)
				off[k++] = (int64_t)m->params[i].off;
		off[k] = (int64_t)n;
		if (!(st = kiln_device_copy_async(m->dev, m->offsets_d, off,
						  (size_t)(k + 1) * sizeof(int64_t), KILN_COPY_H2D,
						  stream)))
			st = kiln_device_stream_sync(m->dev, stream);
	}
	/* no optimizer step taken yet */
	if (!st) {
		int64_t zero = 0;
		memcpy(host, &zero, sizeof zero);
		if (!(st = kiln_device_copy_async(m->dev, m->opt_step_d, host, sizeof zero,
						  KILN_COPY_H2D, stream)))
			st = kiln_device_stream_sync(m->dev, stream);
	}
	/* zero the state (and the grads, so frozen or unused slots are defined;
	 * a stage's rank holding its slice alone: that slice, and no state) */
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_FILL;
	op.n_out = 1;
	op.f[0] = 0;
	const size_t glo = m->held ? m->held_lo : 0;
	int64_t all = (int64_t)(m->held ? m->held_hi - glo : m->n_elems);
	int64_t ns = m->state_d ? (int64_t)nst : 0;
	kiln_tensor_desc_init(&op.out[0], KILN_F32, 1, &all);
	if (!st && all)
		st = kiln_device_prepare(m->dev, &op, &fill_grads, NULL);
	kiln_tensor_desc_init(&op.out[0], KILN_F32, 1, &ns);
	if (!st && ns)
		st = kiln_device_prepare(m->dev, &op, &fill_state, NULL);
	if (!st && fill_grads) {
		struct kiln_op_args a = { .out = { m->grads_d + glo } };
		st = kiln_device_run(m->dev, fill_grads, &a, stream);
	}
	if (!st && fill_state) {
		struct kiln_op_args a = { .out = { m->state_d } };
		st = kiln_device_run(m->dev, fill_state, &a, stream);
	}
	/* sync even after a failure: the plans may still be queued */
	st2 = kiln_device_stream_sync(m->dev, stream);
	kiln_device_plan_free(m->dev, fill_grads);
	kiln_device_plan_free(m->dev, fill_state);
	kiln_device_host_free(m->dev, host);
	return st ? st : st2;
}

kiln_status kiln_model_optim_plan(struct kiln_model *m, size_t n, void **plan)
{
	const struct kiln_optim_shape shape = {
		.n = (int64_t)n,
		.n_tensors = m->n_tensors,
		.decay_mult = m->wd_mult_d != NULL,
		.gated = m->step_ok_d != NULL,
		.copy_dtype = m->params_c ? m->cdtype : 0,
	};
	size_t ws = 0;
	kiln_status st = m->optim->plan(m->optim_ctx, m->dev, &shape, plan, &ws);
	if (st || ws <= m->optim_ws_bytes)
		return st;
	/* one workspace serves every plan: they run one after another on the
	 * compute stream */
	kiln_device_free(m->dev, m->optim_ws);
	m->optim_ws = NULL;
	m->optim_ws_bytes = 0;
	if ((st = kiln_device_alloc(m->dev, ws, &m->optim_ws)))
		return st;
	m->optim_ws_bytes = ws;
	return KILN_OK;
}

void kiln_model_optim_plan_free(struct kiln_model *m, void *plan)
{
	if (plan && m->optim && m->optim->plan_free)
		m->optim->plan_free(m->optim_ctx, m->dev, plan);
}

kiln_status kiln_model_optim_run(struct kiln_model *m, void *plan, const float *grads, size_t lo,
				 float *state, size_t stride, const float *lr, void *stream)
{
	struct kiln_optim_args a;
	memset(&a, 0, sizeof a);
	a.grads = grads;
	a.lr = lr;
	a.step = m->opt_step_d;
	a.offsets = m->offsets_d;
	a.decay_mult = m->wd_mult_d ? m->wd_mult_d + lo : NULL;
	a.gate = m->step_ok_d;
	a.params = m->params_d + lo;
	for (int s = 0; s < m->state_slots; s++)
		a.state[s] = state ? state + (size_t)s * stride : NULL;
	if (m->params_c)
		a.copy = (char *)m->params_c + lo * kiln_dtype_size(m->cdtype);
	a.workspace = m->optim_ws;
	a.workspace_bytes = m->optim_ws_bytes;
	return m->optim->step(m->optim_ctx, m->dev, plan, &a, stream);
}

kiln_status kiln_model_optim_step(struct kiln_model *m, const float *lr, void *stream)
{
	kiln_status st;
	if (!m->n_trainable)
		return KILN_OK;
	if (!m->optim_plan)
		return kiln_error(KILN_EINVAL, "optimizer step before kiln_model_optim_prepare");
	/* advance first: the optimizer reads the (1-based) number of the step
	 * it takes */
	if ((st = kiln_model_opt_step_advance(m, stream)))
		return st;
	return kiln_model_optim_run(m, m->optim_plan, m->grads_d, 0, m->state_d, m->n_trainable,
				    lr, stream);
}

kiln_status kiln_model_opt_step_advance(struct kiln_model *m, void *stream)
{
	/* a skipped step (gate 0) is not counted */
	struct kiln_op_args c = { .in = { m->step_ok_d }, .out = { m->opt_step_d } };
	return kiln_device_run(m->dev, m->opt_step_plan ? m->opt_step_plan : m->step_plan, &c,
			       stream);
}

int kiln_model_state_buffers(struct kiln_model *m, struct kiln_state_buf *out, int max)
{
	struct kiln_state_buf all[6 + KILN_OPTIM_MAX_SLOTS];
	int n = 0;
	const size_t state_bytes = m->state_d ? m->n_trainable * sizeof(float) : 0;
	kiln_model_weights_written(m); /* the caller may write the parameters (restore) */
	all[n++] = (struct kiln_state_buf){ "params", m->params_d, m->n_elems * sizeof(float) };
	all[n++] = (struct kiln_state_buf){ "buffers", m->buffers_d, m->n_buf_elems * sizeof(float) };
	for (int s = 0; s < m->state_slots; s++)
		all[n++] = (struct kiln_state_buf){ m->optim_info.slot_names[s],
						    m->state_d ? m->state_d + (size_t)s * m->n_trainable : NULL,
						    state_bytes };
	all[n++] = (struct kiln_state_buf){ "step", m->step_d, sizeof(int64_t) };
	all[n++] = (struct kiln_state_buf){ "optim.step", m->opt_step_d, sizeof(int64_t) };
	all[n++] = (struct kiln_state_buf){ "amp.scaler", m->scaler_d,
					    m->scaler_d ? 4 * sizeof(float) : 0 };
	int k = 0;
	for (int i = 0; i < n; i++) {
		if (!all[i].bytes)
			continue;
		if (k < max)
			out[k] = all[i];
		k++;
	}
	return k;
}
