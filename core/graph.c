/* core/graph.c - build the model from [layer.NAME] sections: wire the
 * layers' inputs, configure and infer every layer, lay out the flat
 * parameter buffers; parameter access and initialisation.  Plans are made
 * in core/plan.c, their memory laid out in core/plan_memory.c and run in
 * core/plan_run.c.
 */
#include "graph.h"
#include "pipeline.h" /* kiln_pipe_read_stages */

#include <math.h>
#include <stdio.h>


/* ---- model ------------------------------------------------------------ */

int kiln_model_find_layer(const struct kiln_model *m, int upto, const char *name)
{
	for (int i = 0; i < upto; i++)
		if (!strcmp(m->layers[i].name, name))
			return i;
	return -2;
}

static char *trim(char *s)
{
	while (*s == ' ' || *s == '\t')
		s++;
	size_t n = strlen(s);
	while (n && (s[n - 1] == ' ' || s[n - 1] == '\t'))
		s[--n] = 0;
	return s;
}

static kiln_status wire_inputs(struct kiln_model *m, int i, const struct kiln_config *cfg)
{
	struct model_layer *L = &m->layers[i];
	const char *one = kiln_config_get(cfg, L->section, "input");
	const char *many = kiln_config_get(cfg, L->section, "inputs");
	char buf[1024];
	if (one && many)
		return kiln_error(KILN_ECONFIG, "%s: [%s] sets both 'input' and 'inputs'; use one",
				  kiln_config_where(cfg, L->section, "inputs"), L->section);
	if (!one && !many) {
		L->n_in = 1;
		L->in[0] = i - 1; /* previous layer, or the data for the first */
		return KILN_OK;
	}
	snprintf(buf, sizeof buf, "%s", one ? one : many);
	const char *key = one ? "input" : "inputs";
	L->n_in = 0;
	/* every name between commas (strtok_r skipped empty ones: `inputs
	 * = ,,` was zero inputs, refused at the type line, session 34) */
	for (char *t = buf, *next; t; t = next) {
		if ((next = strchr(t, ',')))
			*next++ = 0;
		t = trim(t);
		if (!*t)
			return kiln_error(KILN_ECONFIG, "%s: [%s] %s = %s: an empty layer name (a stray comma?)",
					  kiln_config_where(cfg, L->section, key), L->section, key,
					  one ? one : many);
		if (L->n_in == KILN_LAYER_MAX_INPUTS)
			return kiln_error(KILN_ECONFIG, "%s: [%s] has more than %d inputs",
					  kiln_config_where(cfg, L->section, key), L->section,
					  KILN_LAYER_MAX_INPUTS);
		int j = !strcmp(t, "data") ? -1 : kiln_model_find_layer(m, i, t);
		if (j == -2)
			return kiln_error(KILN_ECONFIG,
					  "%s: [%s] %s = %s: no layer '%s' above this one (inputs must come earlier in the file, or be 'data')",
					  kiln_config_where(cfg, L->section, key), L->section, key,
					  one ? one : many, t);
		L->in[L->n_in++] = j;
	}
	return KILN_OK;
}

void kiln_plan_node_free(struct plan_node *n, struct kiln_device *dev)
{
	/* without destroy the layer owns nothing the core may free */
	if (n->ops && n->ops->destroy)
		n->ops->destroy(kiln_host_table(), &n->l, n->planned ? dev : NULL);
	n->l.priv = NULL;
}

/* The data input as layers see it: [batch, sample...], 4-d inputs in the
 * model's layout. */
void kiln_model_data_desc(const struct kiln_model *m, int64_t batch, struct kiln_tensor_desc *d)
{
	*d = m->sample;
	memmove(&d->dims[1], &m->sample.dims[0], sizeof(int64_t) * (KILN_MAX_DIMS - 1));
	d->dims[0] = batch;
	d->ndim = m->sample.ndim + 1;
	d->layout = d->ndim == 4 ? m->layout : KILN_ROW;
	if (m->cdtype != KILN_F32 && m->sample.dtype != KILN_I32)
		d->dtype = m->cdtype; /* the plan converts the input (token ids stay i32) */
}

/* Is layer i's output read by exactly one layer, of type `type`? */
static int only_consumer_is(const struct kiln_model *m, int i, const char *type)
{
	int n = 0, match = 0;
	for (int j = i + 1; j < m->n_layers; j++)
		for (int k = 0; k < m->layers[j].n_in; k++)
			if (m->layers[j].in[k] == i) {
				n++;
				match = !strcmp(m->layers[j].type->name, type);
			}
	return n == 1 && match;
}

/* The only reader of layer i's output, else -1 (graph.h). */
int kiln_model_only_consumer(const struct kiln_model *m, int i)
{
	int who = -1;
	for (int j = i + 1; j < m->n_layers; j++)
		for (int k = 0; k < m->layers[j].n_in; k++)
			if (m->layers[j].in[k] == i) {
				if (who >= 0)
					return -1;
				who = j;
			}
	return who;
}

/* 1 + the enum kiln_act of the activation layer that alone reads layer
 * i's output and may become the epilogue of layer i's ops
 * (kiln_layer.fuse_act), else 0.  fuse (kiln_model_infer's): ReLU fuses
 * from KILN_FUSE_RELU on (its backward needs only the fused output), GELU
 * with KILN_FUSE_ALL (plans without a backward: its derivative needs the
 * input, which the fused op does not keep). */
static int fusable_act(const struct kiln_model *m, int i, int fuse)
{
	const int j = kiln_model_only_consumer(m, i);
	if (!m->fuse || !fuse || j < 0 || m->layers[j].n_in != 1)
		return 0;
	/* a view cannot cross a pipeline stage: the activation would be
	 * sent before its epilogue ran, its gradient applied on the wrong side */
	if (m->stage && m->stage[i] != m->stage[j])
		return 0;
	const char *type = m->layers[j].type->name;
	if (!strcmp(type, "relu"))
		return 1 + KILN_ACT_RELU;
	if (strcmp(type, "gelu") || fuse < KILN_FUSE_ALL)
		return 0;
	const char *approx = kiln_config_get(m->cfg, m->layers[j].section, "approximate");
	return 1 + (approx && !strcmp(approx, "tanh") ? KILN_ACT_GELU_TANH : KILN_ACT_GELU);
}

/* Token ids (i32 data) must meet a layer that turns them into floating
 * point activations (an embedding): one that passes the integers on would
 * compute on them as numbers.  Refused here, naming the layer, before any
 * device op is prepared. */
static kiln_status check_token_input(const struct kiln_model *m, int i, const struct kiln_layer *l)
{
	const struct model_layer *L = &m->layers[i];
	for (int k = 0; k < L->n_in; k++)
		if (L->in[k] < 0 && l->in[k].dtype == KILN_I32 && l->out.dtype == KILN_I32)
			return kiln_error(KILN_ECONFIG, "%s: layer '%s' (%s) reads the data's token ids (i32): the first layer of a model on tokens must map ids to vectors (type = embedding)",
					  kiln_config_where(m->cfg, L->section, "type"), L->name,
					  L->type->name);
	return KILN_OK;
}

/* Every tensor a layer's shapes make (its output, its parameters) within
 * KILN_TENSOR_MAX_BYTES: a config whose shapes multiply past it is refused
 * here, naming the layer, before any count can wrap further on. */
static kiln_status check_sizes(const struct kiln_model *m, int i, const struct kiln_layer *l)
{
	const struct model_layer *L = &m->layers[i];
	char d[200];
	for (int k = -1; k < l->n_params; k++) {
		const struct kiln_tensor_desc *t = k < 0 ? &l->out : &l->params[k].desc;
		if (kiln_tensor_size(t, NULL, NULL))
			return kiln_error(KILN_ECONFIG, "%s: layer '%s' (%s): its %s%s %s is larger than %llu bytes (its size overflows): make the layer smaller",
					  kiln_config_where(m->cfg, L->section, "type"), L->name,
					  L->type->name, k < 0 ? "output" : "parameter ",
					  k < 0 ? "" : l->params[k].suffix,
					  kiln_tensor_desc_str(t, d, sizeof d),
					  (unsigned long long)KILN_TENSOR_MAX_BYTES);
	}
	return KILN_OK;
}

/* A layer's output layout when it is not its input's (kiln_layer_out_layout),
 * for the layer being inferred, and whether kiln_model_infer may choose one
 * (kiln_model_mixed_stem). */
static _Thread_local const struct kiln_layer *inferring;
static _Thread_local int inferring_layout = -1;
static _Thread_local int mixed_off;

int kiln_layer_out_layout(const struct kiln_layer *l)
{
	return l && l == inferring ? inferring_layout : -1;
}

void kiln_model_mixed_stem(int on) { mixed_off = !on; }

/* The maxpool k whose input, layer i's output, may be NHWC in an NCHW model
 * (issue 22): i a built-in conv of one f32 input channel in NCHW (the
 * same bytes in NHWC), its ReLU fusable, the relu alone read by a maxpool
 * alone, one device.  The conv then writes NHWC (oneDNN's blocked forward
 * without the reorder of y to NCHW; its weight gradient reads dy as it
 * is), the maxpool reads NHWC and writes NCHW (POOL of mixed layouts, ABI
 * 2.17), so the rest of the model is unchanged.  A device that refuses
 * the mixed POOL fails the plan, which kiln_model_plan_ex then makes again
 * without it.  -1: not such a conv. */
static int mixed_stem(const struct kiln_model *m, const struct plan_node *n, int i)
{
	const struct kiln_tensor_desc *x = &n->l.in[0];
	if (mixed_off || m->stage || strcmp(m->layers[i].type->name, "conv") || m->layers[i].n_in != 1 ||
	    n->l.fuse_act != 1 + KILN_ACT_RELU || x->ndim != 4 || x->layout != KILN_NCHW ||
	    x->dims[1] != 1 || x->dtype != KILN_F32)
		return -1;
	const int j = kiln_model_only_consumer(m, i);
	const int k = j < 0 ? -1 : kiln_model_only_consumer(m, j);
	if (k < 0 || strcmp(m->layers[k].type->name, "maxpool") || m->layers[k].n_in != 1)
		return -1;
	return k;
}

/* configure + infer every layer for `batch` rows into nodes[]. */
kiln_status kiln_model_infer(struct kiln_model *m, const struct kiln_tensor_desc *data,
			     int64_t decode, int fuse, struct plan_node *nodes)
{
	const struct kiln_host *h = kiln_host_table();
	kiln_status st;
	char d[200];
	if (kiln_tensor_size(data, NULL, NULL))
		return kiln_error(KILN_ECONFIG, "the data batch %s is larger than %llu bytes (its size overflows): make the batch smaller",
				  kiln_tensor_desc_str(data, d, sizeof d),
				  (unsigned long long)KILN_TENSOR_MAX_BYTES);
	int stem_pool = -1; /* the maxpool writing NCHW from NHWC (mixed_stem) */
	for (int i = 0; i < m->n_layers; i++) {
		struct model_layer *L = &m->layers[i];
		struct plan_node *n = &nodes[i];
		const struct kiln_layer_ops *ops = L->type->ops;
		n->ops = ops;
		n->l.name = L->name;
		n->l.type = L->type->name;
		n->l.trainable = L->trainable;
		n->l.n_in = L->n_in;
		n->l.index = i;
		n->l.seed = m->seed;
		n->l.before_norm = only_consumer_is(m, i, "batchnorm");
		/* read by loss layers only: the scaler's scale or the
		 * pipeline's mean (kiln_layer_run.loss_scale, plan_run.c) */
		n->l.loss_scaled = m->scaler_d != NULL || m->seed_d != NULL;
		n->l.sync_ranks = m->group_ranks;       /* read by batchnorm only */
		n->l.compute_dtype = m->cdtype;         /* read by embedding only */
		n->l.decode_len = decode;
		/* an activation fused into the layer before it (a view: its
		 * act_fused set by that layer, below) applies nothing itself,
		 * so it passes no fusion on: the activation after it runs */
		n->l.fuse_act = n->l.act_fused ? 0 : fusable_act(m, i, fuse);
		if (L->n_in < ops->min_inputs || L->n_in > ops->max_inputs)
			return kiln_error(KILN_ECONFIG, "%s: layer '%s' (%s) takes %d..%d inputs, got %d",
					  kiln_config_where(m->cfg, L->section, "type"), L->name,
					  L->type->name, ops->min_inputs, ops->max_inputs, L->n_in);
		for (int k = 0; k < L->n_in; k++) {
			int j = L->in[k];
			if (j >= 0 && nodes[j].l.is_loss)
				return kiln_error(KILN_ECONFIG, "%s: layer '%s' reads the loss layer '%s'",
						  kiln_config_where(m->cfg, L->section, "type"), L->name,
						  nodes[j].l.name);
			if (j < 0) {
				n->l.in[k] = *data;
			} else {
				n->l.in[k] = nodes[j].l.out;
			}
		}
		char note[300];
		if (ops->configure &&
		    (st = ops->configure(h, &n->l, m->cfg, L->section)))
			return kiln_error_wrap(st, "layer '%s'%s", L->name,
					       kiln_config_unset_note(m->cfg, L->section, note, sizeof note));
		int k = -1;
		inferring = &n->l;
		inferring_layout = i == stem_pool ? KILN_NCHW
				   : stem_pool < 0 && (k = mixed_stem(m, n, i)) >= 0 ? KILN_NHWC
										       : -1;
		st = ops->infer(h, &n->l);
		inferring = NULL;
		if (st)
			return kiln_error_wrap(st, "layer '%s' (%s)", L->name, L->type->name);
		if (k >= 0 && n->l.out.layout == KILN_NHWC)
			stem_pool = k; /* (logged by the plan the device takes: plan.c) */
		if (n->l.fuse_act && n->l.act_fused) /* the activation is now a view */
			nodes[kiln_model_only_consumer(m, i)].l.act_fused = 1;
		if ((st = check_sizes(m, i, &n->l)) || (st = check_token_input(m, i, &n->l)))
			return st;
	}
	return KILN_OK;
}

/* Flat buffers: trainable parameters first (the optimizer touches one
 * leading range), then frozen ones; non-trained state (is_buffer) goes to
 * the separate buffers region, which checkpoints include and optimizers
 * skip. */
static kiln_status layout_params(struct kiln_model *m, struct plan_node *nodes)
{
	int total = 0;
	for (int i = 0; i < m->n_layers; i++)
		total += nodes[i].l.n_params;
	m->params = calloc((size_t)(total ? total : 1), sizeof *m->params);
	if (!m->params)
		return kiln_error(KILN_ENOMEM, "out of memory");
	for (int i = 0; i < m->n_layers; i++)
		m->layers[i].n_params = nodes[i].l.n_params;
	kiln_status st = kiln_model_tie_slots(m, nodes);
	if (st)
		return st;
	for (int pass = 0; pass < 3; pass++)
		for (int i = 0; i < m->n_layers; i++) {
			struct model_layer *L = &m->layers[i];
			for (int k = 0; k < L->n_params; k++) {
				struct kiln_param_spec *ps = &nodes[i].l.params[k];
				int buffer = ps->is_buffer != 0;
				int tr = L->trainable && !buffer;
				int want = buffer ? 2 : tr ? 0 : 1;
				if (want != pass || (L->tie >= 0 && k == L->tie_slot))
					continue; /* a tied slot reads its Y's tensor */
				struct model_param *p = &m->params[m->n_params];
				L->pidx[k] = m->n_params++;
				snprintf(p->name, sizeof p->name, "%s.%s", L->name, ps->suffix);
				p->desc = ps->desc;
				p->init = ps->init;
				p->fan_in = ps->fan_in;
				p->layer = p->grad_layer = i;
				p->trainable = tr;
				p->buffer = buffer;
				p->nonneg = buffer && (ps->is_buffer & KILN_PARAM_NONNEG);
				p->slot = k;
				p->numel = kiln_tensor_numel(&ps->desc);
				/* keep every tensor 64-byte aligned */
				size_t n = kiln_align_up((size_t)p->numel * 4) / 4;
				if (buffer) {
					p->off = m->n_buf_elems;
					m->n_buf_elems += n;
				} else {
					p->off = m->n_elems;
					m->n_elems += n;
					if (tr)
						m->n_trainable = m->n_elems;
				}
			}
		}
	kiln_model_tie_link(m);
	return KILN_OK;
}

/* The [layer.NAME] sections in file order: each layer's type (from the
 * registry), trainable flag and inputs.  m->layers has room for all. */
static kiln_status read_layers(struct kiln_model *m, const struct kiln_registry *reg)
{
	const struct kiln_config *cfg = m->cfg;
	kiln_status st;
	for (int i = 0; kiln_config_section(cfg, i); i++) {
		const char *sec = kiln_config_section(cfg, i);
		if (strncmp(sec, "layer.", 6))
			continue;
		struct model_layer *L = &m->layers[m->n_layers++];
		L->section = kiln_strdup(sec);
		L->name = kiln_strdup(sec + 6);
		const char *type = kiln_config_get(cfg, sec, "type");
		char note[300];
		if (!type)
			return kiln_error(KILN_ECONFIG, "%s: [%s] needs 'type'%s",
					  kiln_config_where(cfg, sec, NULL), sec,
					  kiln_config_unset_note(cfg, sec, note, sizeof note));
		if ((st = kiln_registry_find(reg, KILN_PLUGIN_LAYER, type, &L->type))) {
			kiln_error_wrap(KILN_ECONFIG, "%s: [%s]", kiln_config_where(cfg, sec, "type"), sec);
			return KILN_ECONFIG;
		}
		L->trainable = 1;
		kiln_config_get_bool(cfg, sec, "trainable", &L->trainable);
		if ((st = wire_inputs(m, m->n_layers - 1, cfg)))
			return st;
	}
	return kiln_model_read_ties(m);
}

/* Exactly one loss layer (m->loss_layer), and every other layer leads to
 * it: a dead end would get no gradient (and is almost always a wiring
 * mistake). */
static kiln_status check_wiring(struct kiln_model *m, const struct plan_node *nodes)
{
	const struct kiln_config *cfg = m->cfg;
	for (int i = 0; i < m->n_layers; i++)
		if (nodes[i].l.is_loss) {
			if (m->loss_layer >= 0)
				return kiln_error(KILN_ECONFIG, "%s: a second loss layer '%s' (first: '%s')",
						  kiln_config_where(cfg, m->layers[i].section, "type"),
						  m->layers[i].name, m->layers[m->loss_layer].name);
			m->loss_layer = i;
		}
	if (m->loss_layer < 0)
		return kiln_error(KILN_ECONFIG,
				  "%s: the model has no loss layer; end it with a [layer.loss] type = softmax_xent",
				  kiln_config_where(cfg, m->layers[m->n_layers - 1].section, "type"));
	for (int i = m->n_layers - 1; i >= 0; i--) {
		if (i == m->loss_layer)
			continue;
		int used = 0;
		for (int j = i + 1; j < m->n_layers && !used; j++)
			for (int k = 0; k < m->layers[j].n_in; k++)
				used |= m->layers[j].in[k] == i;
		if (!used)
			return kiln_error(KILN_ECONFIG,
					  "%s: layer '%s' feeds nothing: every layer must lead to the loss (check the input = lines after it)",
					  kiln_config_where(cfg, m->layers[i].section, "type"),
					  m->layers[i].name);
	}
	return KILN_OK;
}

/* *plan: a COUNTER_ADD of k on an i64[1]. */
static kiln_status prepare_counter(struct kiln_model *m, int64_t k, void **plan)
{
	struct kiln_op op;
	int64_t one = 1;
	kiln_status st;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_COUNTER_ADD;
	op.n_out = 1;
	kiln_tensor_desc_init(&op.out[0], KILN_I64, 1, &one);
	op.i[0] = k;
	size_t cws = 0;
	if ((st = kiln_device_prepare(m->dev, &op, plan, &cws)))
		return st;
	if (cws)
		return kiln_error(KILN_ENOTSUP, "the device's counter op asks for workspace");
	return KILN_OK;
}

/* m->step_plan: the COUNTER_ADD of 1 that advances step_d (and drop_d's
 * step); drop_d inside step_d's 64 bytes, the one process's layout. */
static kiln_status prepare_step_counter(struct kiln_model *m)
{
	m->drop_d = m->step_d + 4;
	m->drop_row0 = 0, m->drop_rstride = 1, m->drop_rows = 0, m->drop_acc = 1;
	return prepare_counter(m, 1, &m->step_plan);
}

kiln_status kiln_model_drop_layout(struct kiln_model *m, int64_t row0, int64_t rstride,
				   int64_t rows, int64_t acc)
{
	kiln_status st;
	m->drop_row0 = row0, m->drop_rstride = rstride, m->drop_rows = rows, m->drop_acc = acc;
	for (int k = 0; k < 2; k++) {
		kiln_device_plan_free(m->dev, m->drop_rows_plan[k]);
		m->drop_rows_plan[k] = NULL;
	}
	/* accumulation: each micro-step on to the next rows, the last back */
	if (acc > 1 && ((st = prepare_counter(m, rows, &m->drop_rows_plan[0])) ||
			(st = prepare_counter(m, -(acc - 1) * rows, &m->drop_rows_plan[1]))))
		return st;
	return KILN_OK;
}

kiln_status kiln_model_drop_set(struct kiln_model *m, int64_t step, void *stream)
{
	int64_t host[KILN_DROP_CTR] = { step, m->drop_row0, m->drop_rstride };
	kiln_status st = kiln_device_copy_async(m->dev, m->drop_d, host, sizeof host,
						KILN_COPY_H2D, stream);
	return st ? st : kiln_device_stream_sync(m->dev, stream);
}

kiln_status kiln_model_drop_advance(struct kiln_model *m, int64_t j, void *stream)
{
	kiln_status st;
	if (j + 1 < m->drop_acc) {
		struct kiln_op_args a = { .out = { m->drop_d + 1 } };
		return kiln_device_run(m->dev, m->drop_rows_plan[0], &a, stream);
	}
	if (m->drop_acc > 1) {
		struct kiln_op_args a = { .out = { m->drop_d + 1 } };
		if ((st = kiln_device_run(m->dev, m->drop_rows_plan[1], &a, stream)))
			return st;
	}
	return kiln_model_drop_step(m, stream);
}

/* [model] layout: nchw, nhwc, or auto (the default): channels-last on a
 * device whose traits say its 4-d activations run faster so
 * (KILN_DEVICE_PREFER_NHWC), else nchw. */
int32_t kiln_model_layout(const struct kiln_config *cfg, const struct kiln_device *dev)
{
	const char *v = kiln_config_get(cfg, "model", "layout");
	if (v && !strcmp(v, "nhwc"))
		return KILN_NHWC;
	if (v && !strcmp(v, "nchw"))
		return KILN_NCHW;
	return dev && (kiln_device_traits(dev)->caps & KILN_DEVICE_PREFER_NHWC) ? KILN_NHWC : KILN_NCHW;
}

kiln_status kiln_model_fuse(const struct kiln_config *cfg, int cpu, int *out)
{
	const char *v = kiln_config_get(cfg, "run", "fuse");
	*out = 0;
	if (v && !strcmp(v, "auto")) {
		*out = cpu;
		return KILN_OK;
	}
	kiln_status st = kiln_config_get_bool(cfg, "run", "fuse", out);
	return st == KILN_ENOTFOUND ? KILN_OK : st;
}

/* A failed allocation of the parameters' buffers, said in the model's
 * terms: how many floats, and the largest tensor (a shape typed wrong,
 * `out = 1000000000`, shows there). */
static kiln_status params_too_big(const struct kiln_model *m, kiln_status st, const char *what,
				  size_t bytes)
{
	const struct model_param *big = NULL;
	char d[160] = "";
	for (int i = 0; i < m->n_params; i++)
		if (!big || m->params[i].numel > big->numel)
			big = &m->params[i];
	if (big)
		kiln_tensor_desc_str(&big->desc, d, sizeof d);
	return kiln_error_wrap(st, "the model's %s (%.2f GiB, %zu floats; the largest tensor '%s' %s)",
			       what, (double)bytes / (1024.0 * 1024 * 1024), m->n_elems,
			       big ? big->name : "-", d);
}

kiln_status kiln_model_alloc_whole(struct kiln_model *m)
{
	const size_t bytes = m->n_elems * sizeof(float);
	const size_t state = (size_t)m->state_slots * m->n_trainable * sizeof(float);
	kiln_status st;
	if (!m->bare)
		return KILN_OK;
	if ((st = kiln_device_alloc(m->dev, bytes, (void **)&m->params_d)) ||
	    (st = kiln_device_alloc(m->dev, bytes, (void **)&m->grads_d)))
		return params_too_big(m, st, "parameters and their gradients", 2 * bytes);
	if (state && !m->state_sharded &&
	    (st = kiln_device_alloc(m->dev, state, (void **)&m->state_d)))
		return params_too_big(m, st, "optimizer state", state);
	m->bare = 0;
	return KILN_OK;
}

static kiln_status model_create(const struct kiln_config *cfg, const struct kiln_registry *reg,
				struct kiln_device *dev, const struct kiln_tensor_desc *sample,
				int bare, int sharded, const struct kiln_model_precheck *pre,
				struct kiln_model **out);

kiln_status kiln_model_create(const struct kiln_config *cfg, const struct kiln_registry *reg,
			      struct kiln_device *dev, const struct kiln_tensor_desc *sample,
			      struct kiln_model **out)
{
	if (!cfg || !reg || !dev || !sample || !out)
		return kiln_null_arg("kiln_model_create", !cfg ? "cfg" : !reg ? "reg" : !dev ? "dev" : !sample ? "sample" : "out");
	return model_create(cfg, reg, dev, sample, 0, 0, NULL, out);
}

kiln_status kiln_model_create_sharded(const struct kiln_config *cfg, const struct kiln_registry *reg,
				      struct kiln_device *dev, const struct kiln_tensor_desc *sample,
				      struct kiln_model **out)
{
	return model_create(cfg, reg, dev, sample, 0, 1, NULL, out);
}

kiln_status kiln_model_create_checked(const struct kiln_config *cfg, const struct kiln_registry *reg,
				      struct kiln_device *dev, const struct kiln_tensor_desc *sample,
				      const struct kiln_model_precheck *pre, struct kiln_model **out)
{
	return model_create(cfg, reg, dev, sample, 0, 0, pre, out);
}

kiln_status kiln_model_create_bare(const struct kiln_config *cfg, const struct kiln_registry *reg,
				   struct kiln_device *dev, const struct kiln_tensor_desc *sample,
				   struct kiln_model **out)
{
	return model_create(cfg, reg, dev, sample, 1, 0, NULL, out);
}

static int count_layers(const struct kiln_config *cfg)
{
	int n = 0;
	for (int i = 0; kiln_config_section(cfg, i); i++)
		n += !strncmp(kiln_config_section(cfg, i), "layer.", 6);
	return n;
}

static kiln_status no_layers(const struct kiln_config *cfg)
{
	/* no section [layer]: where() names the config file */
	return kiln_error(KILN_ECONFIG, "%s: no [layer.NAME] sections: the model is empty",
			  kiln_config_where(cfg, "layer", NULL));
}

kiln_status kiln_model_check_names(const struct kiln_config *cfg, const struct kiln_registry *reg)
{
	const int n = count_layers(cfg);
	if (!n)
		return no_layers(cfg);
	struct kiln_model *m = calloc(1, sizeof *m);
	if (!m || !(m->layers = calloc((size_t)n, sizeof *m->layers))) {
		free(m);
		return kiln_error(KILN_ENOMEM, "out of memory");
	}
	m->cfg = cfg;
	m->loss_layer = -1;
	kiln_status st = read_layers(m, reg);
	/* [model] stages' names ([layer.X] stage too); `auto` places the
	 * layers by their costs, which need the shapes: building the model's */
	const char *v = kiln_config_get(cfg, "model", "stages");
	if (!st && !(v && (!strcmp(v, "auto") || !strncmp(v, "auto:", 5))))
		st = kiln_pipe_read_stages(m);
	kiln_model_free(m); /* (no device: names, layers and stages alone) */
	return st;
}

static kiln_status model_create(const struct kiln_config *cfg, const struct kiln_registry *reg,
				struct kiln_device *dev, const struct kiln_tensor_desc *sample,
				int bare, int sharded, const struct kiln_model_precheck *pre,
				struct kiln_model **out)
{
	kiln_status st;
	*out = NULL;
	struct kiln_model *m = calloc(1, sizeof *m);
	if (!m)
		return kiln_error(KILN_ENOMEM, "out of memory");
	m->cfg = cfg;
	m->bare = 1; /* (kiln_model_alloc_whole below, unless bare) */
	m->state_sharded = sharded;
	m->dev = dev;
	m->sample = *sample;
	if (sample->ndim < 1 || sample->ndim >= KILN_MAX_DIMS) {
		kiln_model_free(m);
		return kiln_error(KILN_ENOTSUP, "samples of %d dimensions: 1 to %d are supported",
				  sample->ndim, KILN_MAX_DIMS - 1);
	}
	m->loss_layer = -1;
	int64_t seed = 0;
	kiln_config_get_int(cfg, "run", "seed", &seed);
	m->seed = (uint64_t)seed;
	m->layout = kiln_model_layout(cfg, dev);
	if ((st = kiln_model_fuse(cfg, dev && kiln_device_traits(dev)->type == KILN_DEVICE_CPU, &m->fuse))) {
		kiln_model_free(m);
		return st;
	}
	int n = count_layers(cfg);
	if (!n) {
		kiln_model_free(m);
		return no_layers(cfg);
	}
	m->layers = calloc((size_t)n, sizeof *m->layers);
	struct plan_node *nodes = calloc((size_t)n, sizeof *nodes);
	if (!m->layers || !nodes) {
		free(nodes);
		kiln_model_free(m);
		return kiln_error(KILN_ENOMEM, "out of memory");
	}
	if ((st = read_layers(m, reg)))
		goto fail;
	struct kiln_tensor_desc data;
	kiln_model_data_desc(m, 1, &data);
	if ((st = kiln_model_infer(m, &data, 0, KILN_FUSE_RELU, nodes)))
		goto fail;
	if ((st = check_wiring(m, nodes)))
		goto fail;
	if ((st = layout_params(m, nodes)))
		goto fail;
	/* the parameter table is known, nothing is allocated yet */
	if (pre && (st = pre->check(pre->arg, m)))
		goto fail;
	/* the speed guides' rule, applied by the conv layer: a convolution
	 * feeding only a batchnorm gets no bias unless asked for (the
	 * normalisation subtracts it again) */
	for (int i = 0; i < m->n_layers; i++)
		if (nodes[i].l.before_norm && !strcmp(m->layers[i].type->name, "conv") &&
		    !strcmp(kiln_config_where(cfg, m->layers[i].section, "bias"), "default"))
			kiln_log(KILN_LOG_INFO, "core",
				 "layer '%s': convolution followed by batchnorm gets no bias (set bias = 1 to keep one)",
				 m->layers[i].name);
	for (int i = 0; i < m->n_layers; i++)
		kiln_plan_node_free(&nodes[i], NULL);
	free(nodes);
	nodes = NULL;
	if ((st = kiln_model_optim_configure(m, reg)))
		goto fail;
	/* (the optimizer's buffers but its state: kiln_model_alloc_whole's) */
	if ((st = kiln_device_alloc(dev, m->n_buf_elems * sizeof(float), (void **)&m->buffers_d)) ||
	    (st = kiln_device_alloc(dev, 64, (void **)&m->step_d)) ||
	    (st = kiln_model_optim_alloc(m)) ||
	    (!bare && (st = kiln_model_alloc_whole(m))) ||
	    (st = kiln_model_tie_prepare(m)))
		goto fail;
	if ((st = prepare_step_counter(m)))
		goto fail;
	*out = m;
	return KILN_OK;
fail:
	if (nodes) {
		for (int i = 0; i < m->n_layers; i++)
			kiln_plan_node_free(&nodes[i], NULL);
		free(nodes);
	}
	kiln_model_free(m);
	return st;
}

void kiln_model_free(struct kiln_model *m)
{
	if (!m)
		return;
	for (int i = 0; i < m->n_layers; i++) {
		free(m->layers[i].name);
		free(m->layers[i].section);
	}
	free(m->stage);
	free(m->stage_cost);
	if (m->dev) {
		kiln_model_precision_close(m);
		kiln_model_optim_free(m);
		kiln_model_tie_free(m);
		kiln_device_plan_free(m->dev, m->step_plan);
		kiln_device_plan_free(m->dev, m->drop_rows_plan[0]);
		kiln_device_plan_free(m->dev, m->drop_rows_plan[1]);
		kiln_device_free(m->dev, m->buffers_d);
		kiln_device_free(m->dev, m->step_d);
		kiln_device_free(m->dev, m->params_d);
		if (!m->grads_foreign)
			kiln_device_free(m->dev, m->grads_d);
		kiln_device_free(m->dev, m->params_c);
		kiln_device_plan_free(m->dev, m->pcast_plan);
	}
	free(m->layers);
	free(m->params);
	free(m);
}

int kiln_model_param_count(const struct kiln_model *m) { return m ? m->n_params : 0; }
int kiln_model_compute_dtype(const struct kiln_model *m) { return m->cdtype; }

kiln_status kiln_model_set_compute_dtype(struct kiln_model *m, int dtype)
{
	kiln_status st;
	if (dtype == m->cdtype)
		return KILN_OK;
	if (dtype != KILN_F32 && dtype != KILN_BF16 && dtype != KILN_F16)
		return kiln_error(KILN_EINVAL, "compute dtype %s: f32, bf16 or f16",
				  kiln_dtype_name(dtype));
	if (m->params_c)
		return kiln_error(KILN_EINVAL, "the compute dtype is already %s",
				  kiln_dtype_name(m->cdtype));
	m->cdtype = dtype;
	if (dtype == KILN_F32 || !m->n_elems)
		return KILN_OK;
	struct kiln_op op;
	int64_t n = (int64_t)m->n_elems;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_CAST;
	op.n_in = op.n_out = 1;
	kiln_tensor_desc_init(&op.in[0], KILN_F32, 1, &n);
	kiln_tensor_desc_init(&op.out[0], dtype, 1, &n);
	if ((st = kiln_device_alloc(m->dev, m->n_elems * kiln_dtype_size(dtype), &m->params_c)) ||
	    (st = kiln_device_prepare(m->dev, &op, &m->pcast_plan, NULL)))
		return kiln_error_wrap(st, "the %s compute copy of the parameters",
				       kiln_dtype_name(dtype));
	kiln_model_weights_written(m);
	/* the speed guides' rule: tensor-core (and AVX512-BF16) GEMMs and
	 * convolutions want dimensions that are multiples of 8 */
	for (int i = 0; i < m->n_params; i++) {
		const struct model_param *pm = &m->params[i];
		if (pm->buffer || pm->desc.ndim < 2)
			continue;
		int64_t k = 1;
		for (int d = 1; d < pm->desc.ndim; d++)
			k *= pm->desc.dims[d];
		if (pm->desc.dims[0] % 8 || k % 8)
			kiln_log(KILN_LOG_WARN, "core",
				 "%s: %s compute with %s [%lld outputs, %lld inputs per output]: not multiples of 8, so the low-precision matrix kernels run below their best",
				 m->layers[pm->layer].name, kiln_dtype_name(dtype), pm->name,
				 (long long)pm->desc.dims[0], (long long)k);
	}
	return KILN_OK;
}

kiln_status kiln_model_params_sync(struct kiln_model *m, void *stream)
{
	if (!m->pcopy_stale || !m->pcast_plan)
		return KILN_OK;
	struct kiln_op_args a = { .in = { m->params_d }, .out = { m->params_c } };
	kiln_status st = kiln_device_run(m->dev, m->pcast_plan, &a, stream);
	if (!st)
		m->pcopy_stale = 0;
	return st;
}
size_t kiln_model_param_elems(const struct kiln_model *m) { return m->n_elems; }

void kiln_model_param_get(const struct kiln_model *m, int i, struct kiln_param_info *o)
{
	if (!o)
		return;
	if (!m || i < 0 || i >= m->n_params) {
		memset(o, 0, sizeof *o); /* (documented: kiln/kiln.h) */
		return;
	}
	const struct model_param *p = &m->params[i];
	/* the caller may write the parameters: refresh the compute copy */
	kiln_model_weights_written((struct kiln_model *)m);
	o->name = p->name;
	o->desc = p->desc;
	o->param = (p->buffer ? m->buffers_d : m->params_d) + p->off;
	o->grad = p->trainable ? m->grads_d + p->off : NULL;
	o->trainable = p->trainable;
}

kiln_status kiln_model_param_find(const struct kiln_model *m, const char *name,
				  struct kiln_param_info *out)
{
	for (int i = 0; i < m->n_params; i++)
		if (!strcmp(m->params[i].name, name)) {
			kiln_model_param_get(m, i, out);
			return KILN_OK;
		}
	int t = kiln_model_tie_alias(m, name);
	if (t >= 0) { /* "lm_head.weight", tied: the one tensor, named as its owner's */
		kiln_model_param_get(m, t, out);
		return KILN_OK;
	}
	return kiln_error(KILN_ENOTFOUND, "no parameter named '%s'", name);
}

/* The initial value of element e of parameter p: PyTorch's default init,
 * keyed by (layer, slot, element): independent of layout order, of which
 * layers are frozen and of which other parameters are drawn. */
static float init_value(const struct model_param *p, uint64_t seed, int64_t e)
{
	float bound = p->fan_in > 0 ? 1.0f / sqrtf((float)p->fan_in) : 0.0f;
	uint64_t key = (uint64_t)p->layer << 4 | (uint64_t)p->slot;
	switch (p->init) {
	case KILN_INIT_ONE: return 1.0f;
	case KILN_INIT_KAIMING_UNIFORM:
	case KILN_INIT_BIAS_UNIFORM:
		return (2.0f * kiln_rng_uniform(seed, KILN_RNG_INIT, key, (uint32_t)e) - 1.0f) *
		       bound;
	case KILN_INIT_NORMAL: {
		/* Box-Muller on the element's own two uniforms */
		float u[4];
		kiln_rng_uniform4(seed, KILN_RNG_INIT, key, (uint32_t)e, u);
		return 0.02f * sqrtf(-2.0f * logf(1.0f - u[0])) * cosf(6.2831853f * u[1]);
	}
	default: return 0.0f;
	}
}

/* The p->numel initial values of one tensor into v: init_value's, the
 * uniform draws LANES at a time (kiln_rng_uniform_run, bit for bit the
 * same numbers: most of a run's set-up before this was Philox one element
 * at a time, about 30 ms for the CNN's 3.3 M weights). */
static void init_tensor(const struct model_param *p, uint64_t seed, float *v)
{
	if (p->init != KILN_INIT_KAIMING_UNIFORM && p->init != KILN_INIT_BIAS_UNIFORM) {
		for (int64_t e = 0; e < p->numel; e++)
			v[e] = init_value(p, seed, e);
		return;
	}
	const float bound = p->fan_in > 0 ? 1.0f / sqrtf((float)p->fan_in) : 0.0f;
	const uint64_t key = (uint64_t)p->layer << 4 | (uint64_t)p->slot;
	kiln_rng_uniform_run(seed, KILN_RNG_INIT, key, 0, p->numel, v);
	for (int64_t e = 0; e < p->numel; e++)
		v[e] = (2.0f * v[e] - 1.0f) * bound;
}

/* Copy host[lo, hi) to the region's device bytes (elements). */
static kiln_status init_copy(struct kiln_model *m, float *dst, const float *host, size_t lo,
			     size_t hi, void *stream)
{
	if (hi <= lo)
		return KILN_OK;
	return kiln_device_copy_async(m->dev, dst + lo, host + lo, (hi - lo) * sizeof(float),
				      KILN_COPY_H2D, stream);
}

/* The elements [*lo, *hi) of a region (0 params, 1 buffers) this model
 * holds: all, or a stage's rank's slice of the params (m->held). */
static void region_span(const struct kiln_model *m, int region, size_t *lo, size_t *hi)
{
	*lo = !region && m->held ? m->held_lo : 0;
	*hi = region ? m->n_buf_elems : m->held ? m->held_hi : m->n_elems;
}

/* One region (params or buffers): draw every tensor held here and not
 * given by a file, and copy the drawn runs (the alignment padding zero) to
 * the device, leaving the given tensors' bytes as the file wrote them.
 * host[k] stands for element lo + k: a stage's rank draws its slice with
 * the draws of one process (init_value's keys are the tensors' own). */
static kiln_status init_region(struct kiln_model *m, int region, uint64_t seed, float *host,
			       void *stream)
{
	size_t lo, hi;
	region_span(m, region, &lo, &hi);
	const size_t count = hi - lo;
	float *dst = (region ? m->buffers_d : m->params_d) + lo;
	size_t run = 0; /* start of the run of drawn elements (from lo) */
	kiln_status st = KILN_OK;
	memset(host, 0, count * sizeof(float));
	for (int i = 0; i < m->n_params && !st; i++) {
		const struct model_param *p = &m->params[i];
		if (p->buffer != region || p->off < lo || p->off >= hi)
			continue;
		const size_t off = p->off - lo;
		if (p->given) {
			st = init_copy(m, dst, host, run, off, stream);
			run = off + (size_t)p->numel;
			continue;
		}
		init_tensor(p, seed, host + off);
	}
	if (!st)
		st = init_copy(m, dst, host, run, count, stream);
	/* the host buffer is reused: wait for the copies */
	kiln_status st2 = kiln_device_stream_sync(m->dev, stream);
	return st ? st : st2;
}

/* The micro-step counter at 0 and dropout's counter at step 0 (its
 * layout's rows), through host (64 bytes at least); no parameter is given
 * any more. */
static kiln_status init_step(struct kiln_model *m, float *host, void *stream)
{
	int64_t c[8] = { 0 };
	for (int i = 0; i < m->n_params; i++)
		m->params[i].given = 0;
	kiln_model_weights_written(m);
	c[4 + 1] = m->drop_row0, c[4 + 2] = m->drop_rstride; /* drop_d = step_d + 4 */
	memcpy(host, c, sizeof c);
	kiln_status st = kiln_device_copy_async(m->dev, m->step_d, host, sizeof c,
						KILN_COPY_H2D, stream);
	return st ? st : kiln_device_stream_sync(m->dev, stream);
}

kiln_status kiln_model_init_params(struct kiln_model *m, uint64_t seed, void *stream)
{
	float *host;
	int drawn = 0;
	size_t lo, hi;
	region_span(m, 0, &lo, &hi);
	size_t n = hi - lo > m->n_buf_elems ? hi - lo : m->n_buf_elems;
	if (n < 16)
		n = 16; /* the step counters' 64 bytes go through this buffer too */
	kiln_status st = kiln_device_host_alloc(m->dev, n * sizeof(float), (void **)&host);
	if (st)
		return st;
	for (int i = 0; i < m->n_params; i++) /* (a held slice: its tensors) */
		drawn += !m->params[i].given &&
			 (m->params[i].buffer || (m->params[i].off >= lo && m->params[i].off < hi));
	for (int region = 0; region < 2 && !st; region++)
		st = init_region(m, region, seed, host, stream);
	if (!st)
		st = init_step(m, host, stream);
	kiln_device_host_free(m->dev, host);
	/* tests/int8.sh counts these lines: an evaluation of a whole file
	 * draws nothing (kiln_model_init_loaded) */
	kiln_log(KILN_LOG_DEBUG, "core", "initial weights: %d of %d tensors drawn ([run] seed %llu)",
		 drawn, m->n_params, (unsigned long long)seed);
	return st;
}

kiln_status kiln_model_init_loaded(struct kiln_model *m, void *stream)
{
	uint64_t host[8];
	kiln_log(KILN_LOG_DEBUG, "core",
		 "initial weights: none drawn (%d tensors, every one from the file that follows)",
		 m->n_params);
	return init_step(m, (float *)host, stream);
}

int kiln_model_nonfinite(const struct kiln_model *m, int region, size_t off, const float *v,
			 size_t n, int64_t *at)
{
	for (int i = 0; i < m->n_params; i++) {
		const struct model_param *p = &m->params[i];
		const size_t lo = p->off > off ? p->off : off;
		const size_t hi = p->off + (size_t)p->numel < off + n ? p->off + (size_t)p->numel
								      : off + n;
		if (!p->buffer != !region)
			continue;
		for (size_t e = lo; e < hi; e++)
			if (!isfinite(v[e - off])) {
				*at = (int64_t)(e - p->off);
				return i;
			}
	}
	return -1;
}

/* The first tensor (index into m->params) whose values in v (elements
 * [off, off + n) of region) must be >= 0 (KILN_PARAM_NONNEG) and hold a
 * negative one, *at its element in that tensor; -1 when none does. */
static int model_negative(const struct kiln_model *m, int region, size_t off, const float *v,
			  size_t n, int64_t *at)
{
	for (int i = 0; i < m->n_params; i++) {
		const struct model_param *p = &m->params[i];
		const size_t lo = p->off > off ? p->off : off;
		const size_t hi = p->off + (size_t)p->numel < off + n ? p->off + (size_t)p->numel
								      : off + n;
		if (!p->nonneg || !p->buffer != !region)
			continue;
		for (size_t e = lo; e < hi; e++)
			if (v[e - off] < 0) {
				*at = (int64_t)(e - p->off);
				return i;
			}
	}
	return -1;
}

kiln_status kiln_model_finite_check(const struct kiln_model *m, const char *file, int region,
				    size_t off, const float *v, size_t n)
{
	int64_t at;
	int i = kiln_model_nonfinite(m, region, off, v, n, &at);
	char shape[100];
	if (i >= 0) {
		kiln_tensor_desc_str(&m->params[i].desc, shape, sizeof shape);
		return kiln_error(KILN_EDATA, "%s: tensor '%s' %s holds a non-finite value (%g at element %lld): refused (NaN or inf weights compute NaN, or finite but wrong outputs where a fused ReLU hides them)",
				  file, m->params[i].name, shape,
				  (double)v[(size_t)at + m->params[i].off - off], (long long)at);
	}
	if ((i = model_negative(m, region, off, v, n, &at)) < 0)
		return KILN_OK;
	kiln_tensor_desc_str(&m->params[i].desc, shape, sizeof shape);
	return kiln_error(KILN_EDATA, "%s: tensor '%s' %s holds a negative variance (%g at element %lld): refused (its square root is NaN: every output of the layer would be NaN)",
			  file, m->params[i].name, shape, (double)v[(size_t)at + m->params[i].off - off],
			  (long long)at);
}

kiln_status kiln_model_count_advance(struct kiln_model *m, void *stream)
{
	struct kiln_op_args a = { .out = { m->step_d } };
	return kiln_device_run(m->dev, m->step_plan, &a, stream);
}

kiln_status kiln_model_drop_step(struct kiln_model *m, void *stream)
{
	struct kiln_op_args a = { .out = { m->drop_d } };
	return kiln_device_run(m->dev, m->step_plan, &a, stream);
}

kiln_status kiln_model_step_advance(struct kiln_model *m, void *stream)
{
	kiln_status st = kiln_model_count_advance(m, stream);
	return st ? st : kiln_model_drop_step(m, stream);
}
