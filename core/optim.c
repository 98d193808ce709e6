/* core/optim.c - the model's optimizer: [train] optimizer and its keys
 * turned into one fused device op (KILN_OP_SGD, KILN_OP_ADAMW or
 * KILN_OP_LAMB, plugin.h) over the trainable range of the flat buffers,
 * its state (state_slots x n_trainable floats), the [train] no_decay
 * weight-decay multiplier, LAMB's tensor offsets and the optimizer's step
 * count, all in device memory; and the list of the buffers that define
 * training state (kiln_model_state_buffers).
 *
 * One step is two launches on the compute stream: COUNTER_ADD advances
 * opt_step_d (the op reads the 1-based number of the step it takes), then
 * the fused op reads lr and the step count from device memory.  Nothing per
 * step comes from the host, so one prepared plan serves the whole run.
 * When a finite flag gates the step ([train] skip_nonfinite, loss
 * scaling), the same flag gates the counter: a skipped step is not
 * counted, as PyTorch's GradScaler skips optimizer.step() and with it
 * Adam's step count (and the schedule, which reads the same count).
 */
#include "graph.h"

#include <fnmatch.h>  /* [train] no_decay patterns */
#include <stdio.h>

/* ---- configuration ------------------------------------------------------
 * [train] optimizer picks the fused device op (KILN_OP_SGD, _ADAMW,
 * _LAMB); its constants are fixed here, at create, so a bad value is
 * reported before anything is allocated, and the optimizer state is
 * allocated with the parameters.  The per-step scalars (lr, the step
 * count) stay in device memory and reach the op through its arguments. */

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

static kiln_status get_float(const struct kiln_config *cfg, const char *key, double *v)
{
	kiln_status st = kiln_config_get_float(cfg, "train", key, v);
	return st == KILN_ENOTFOUND ? KILN_OK : st;
}

kiln_status kiln_model_optim_configure(struct kiln_model *m)
{
	const struct kiln_config *cfg = m->cfg;
	const char *name = kiln_config_get(cfg, "train", "optimizer");
	const char *mode = kiln_config_get(cfg, "train", "weight_decay_mode");
	double mu = 0.9, wd = 0, b1 = 0.9, b2 = 0.999, eps = 1e-8;
	int nesterov = 0;
	kiln_status st;
	if ((st = get_float(cfg, "momentum", &mu)) || (st = get_float(cfg, "weight_decay", &wd)) ||
	    (st = get_float(cfg, "beta1", &b1)) || (st = get_float(cfg, "beta2", &b2)) ||
	    (st = get_float(cfg, "eps", &eps)))
		return st;
	if ((st = kiln_config_get_bool(cfg, "train", "nesterov", &nesterov)) && st != KILN_ENOTFOUND)
		return st;
	if (!name)
		name = "sgd";
	const int decoupled = mode && !strcmp(mode, "decoupled");
	const int groups = no_decay_list(cfg) != NULL;
	int64_t n = (int64_t)m->n_trainable, one = 1, T = 0;
	for (int i = 0; i < m->n_params; i++)
		T += m->params[i].trainable;
	m->n_tensors = T;
	struct kiln_op *op = &m->optim_op;
	memset(op, 0, sizeof *op);
	if (!strcmp(name, "sgd")) {
		op->type = KILN_OP_SGD;
		m->state_slots = mu != 0 ? 1 : 0;
		op->i[1] = nesterov;
		op->f[0] = mu;
		op->f[decoupled ? 2 : 1] = wd; /* L2 into the gradient, or SGDW */
	} else if (!strcmp(name, "adamw") || !strcmp(name, "lamb")) {
		op->type = !strcmp(name, "adamw") ? KILN_OP_ADAMW : KILN_OP_LAMB;
		if (!(b1 < 1) || !(b2 < 1))
			return kiln_error(KILN_ECONFIG, "%s: [train] beta%d = %g: betas must be below 1 (the bias correction divides by 1 - beta^t)",
					  kiln_config_where(cfg, "train", b1 < 1 ? "beta2" : "beta1"),
					  b1 < 1 ? 2 : 1, b1 < 1 ? b2 : b1);
		if (mode && !decoupled)
			if (strcmp(kiln_config_where(cfg, "train", "weight_decay_mode"), "default"))
				return kiln_error(KILN_ECONFIG, "%s: [train] weight_decay_mode = %s applies to sgd only: %s always decouples the weight decay",
						  kiln_config_where(cfg, "train", "weight_decay_mode"),
						  mode, name);
		m->state_slots = 2;
		op->f[0] = b1;
		op->f[1] = b2;
		op->f[2] = eps;
		op->f[3] = wd;
	} else {
		return kiln_error(KILN_ECONFIG, "%s: [train] optimizer = %s: one of sgd, adamw, lamb",
				  kiln_config_where(cfg, "train", "optimizer"), name);
	}
	/* grads, lr[, step][, offsets][, multiplier] -> params[, state...] */
	op->i[0] = n;
	kiln_tensor_desc_init(&op->in[op->n_in++], KILN_F32, 1, &n);
	kiln_tensor_desc_init(&op->in[op->n_in++], KILN_F32, 1, &one);
	if (op->type != KILN_OP_SGD)
		kiln_tensor_desc_init(&op->in[op->n_in++], KILN_I64, 1, &one);
	if (op->type == KILN_OP_LAMB) {
		int64_t t1 = T + 1;
		kiln_tensor_desc_init(&op->in[op->n_in++], KILN_I64, 1, &t1);
	}
	if (groups)
		kiln_tensor_desc_init(&op->in[op->n_in++], KILN_F32, 1, &n);
	op->n_out = 1 + m->state_slots;
	for (int k = 0; k < op->n_out; k++)
		op->out[k] = op->in[0];
	return KILN_OK;
}

kiln_status kiln_model_optim_alloc(struct kiln_model *m)
{
	const struct kiln_op *op = &m->optim_op;
	const size_t n = m->n_trainable;
	kiln_status st;
	if ((st = kiln_device_alloc(m->dev, 64, (void **)&m->opt_step_d)))
		return st;
	if (!n)
		return KILN_OK; /* nothing to train: no state */
	if (m->state_slots &&
	    (st = kiln_device_alloc(m->dev, (size_t)m->state_slots * n * sizeof(float),
				    (void **)&m->state_d)))
		return st;
	if (op->type == KILN_OP_LAMB &&
	    (st = kiln_device_alloc(m->dev, (size_t)(m->n_tensors + 1) * sizeof(int64_t),
				    (void **)&m->offsets_d)))
		return st;
	if (no_decay_list(m->cfg) &&
	    (st = kiln_device_alloc(m->dev, n * sizeof(float), (void **)&m->wd_mult_d)))
		return st;
	return KILN_OK;
}

void kiln_model_optim_free(struct kiln_model *m)
{
	kiln_device_plan_free(m->dev, m->optim_plan);
	kiln_device_plan_free(m->dev, m->opt_step_plan);
	kiln_device_free(m->dev, m->state_d);
	kiln_device_free(m->dev, m->wd_mult_d);
	kiln_device_free(m->dev, m->offsets_d);
	kiln_device_free(m->dev, m->opt_step_d);
	kiln_device_free(m->dev, m->optim_ws);
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

	/* the finite flag of [train] skip_nonfinite gates the step: the last
	 * input, once */
	if (m->step_ok_d && !(m->optim_op.flags & KILN_OPF_GATED)) {
		int64_t one = 1;
		m->optim_op.flags |= KILN_OPF_GATED;
		kiln_tensor_desc_init(&m->optim_op.in[m->optim_op.n_in++], KILN_F32, 1, &one);
	}
	/* low-precision compute: the op also writes the compute copy of the
	 * trainable parameters, the last output, in the same pass */
	if (m->params_c && m->optim_op.out[m->optim_op.n_out - 1].dtype != m->cdtype) {
		int64_t nt = (int64_t)n;
		kiln_tensor_desc_init(&m->optim_op.out[m->optim_op.n_out++], m->cdtype, 1, &nt);
	}
	/* a second call replaces the plans */
	kiln_device_plan_free(m->dev, m->optim_plan);
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
		if ((st = kiln_device_prepare(m->dev, &m->optim_op, &m->optim_plan, &m->optim_ws_bytes)))
			return kiln_error_wrap(st, "[train] optimizer over %zu trainable floats", n);
		if (m->optim_ws_bytes &&
		    (st = kiln_device_alloc(m->dev, m->optim_ws_bytes, &m->optim_ws)))
			return st;
	}
	/* host staging: the multiplier, the LAMB offsets, the step count */
	size_t hb = 64;
	if (m->wd_mult_d && n * sizeof(float) > hb)
		hb = n * sizeof(float);
	if (m->offsets_d && (size_t)(m->n_tensors + 1) * sizeof(int64_t) > hb)
		hb = (size_t)(m->n_tensors + 1) * sizeof(int64_t);
	if ((st = kiln_device_host_alloc(m->dev, hb, (void **)&host)))
		return st;
	if (m->wd_mult_d) {
		build_wd_mult(m, no_decay_list(m->cfg), host);
		if (!(st = kiln_device_copy_async(m->dev, m->wd_mult_d, host, n * sizeof(float),
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
	/* zero the state (and the grads, so frozen or unused slots are defined) */
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_FILL;
	op.n_out = 1;
	op.f[0] = 0;
	int64_t all = (int64_t)m->n_elems, ns = (int64_t)nst;
	kiln_tensor_desc_init(&op.out[0], KILN_F32, 1, &all);
	if (!st && all)
		st = kiln_device_prepare(m->dev, &op, &fill_grads, NULL);
	kiln_tensor_desc_init(&op.out[0], KILN_F32, 1, &ns);
	if (!st && ns)
		st = kiln_device_prepare(m->dev, &op, &fill_state, NULL);
	if (!st && fill_grads) {
		struct kiln_op_args a = { .out = { m->grads_d } };
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

kiln_status kiln_model_optim_step(struct kiln_model *m, const float *lr, void *stream)
{
	const struct kiln_op *op = &m->optim_op;
	struct kiln_op_args a;
	kiln_status st;
	int k = 0;
	if (!m->n_trainable)
		return KILN_OK;
	if (!m->optim_plan)
		return kiln_error(KILN_EINVAL, "optimizer step before kiln_model_optim_prepare");
	memset(&a, 0, sizeof a);
	a.in[k++] = m->grads_d;
	a.in[k++] = lr;
	if (op->type != KILN_OP_SGD)
		a.in[k++] = m->opt_step_d;
	if (op->type == KILN_OP_LAMB)
		a.in[k++] = m->offsets_d;
	if (m->wd_mult_d)
		a.in[k++] = m->wd_mult_d;
	if (op->flags & KILN_OPF_GATED)
		a.in[k++] = m->step_ok_d;
	a.out[0] = m->params_d;
	for (int s = 0; s < m->state_slots; s++)
		a.out[1 + s] = m->state_d + (size_t)s * m->n_trainable;
	if (m->params_c)
		a.out[op->n_out - 1] = m->params_c;
	a.workspace = m->optim_ws;
	a.workspace_bytes = m->optim_ws_bytes;
	/* advance first: the op reads the (1-based) number of the step it
	 * takes */
	if ((st = kiln_model_opt_step_advance(m, stream)))
		return st;
	return kiln_device_run(m->dev, m->optim_plan, &a, stream);
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
	static const char *const slot_names[2][2] = {
		{ "optim.momentum", NULL }, { "optim.exp_avg", "optim.exp_avg_sq" }
	};
	struct kiln_state_buf all[8];
	int n = 0;
	const size_t state_bytes = m->state_d ? m->n_trainable * sizeof(float) : 0;
	m->pcopy_stale = 1; /* the caller may write the parameters (restore) */
	all[n++] = (struct kiln_state_buf){ "params", m->params_d, m->n_elems * sizeof(float) };
	all[n++] = (struct kiln_state_buf){ "buffers", m->buffers_d, m->n_buf_elems * sizeof(float) };
	for (int s = 0; s < m->state_slots && s < 2; s++)
		all[n++] = (struct kiln_state_buf){ slot_names[m->state_slots - 1][s],
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
