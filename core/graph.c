/* core/graph.c - build the model from [layer.NAME] sections: wire the
 * layers' inputs, check the wiring, lay out the flat parameter buffers and
 * allocate them; the step and dropout counters; free.  Every layer is
 * configured and inferred in core/graph_infer.c; the parameters' access
 * and initial values are in core/graph_params.c.  Plans are made in
 * core/plan.c, their memory laid out in core/plan_memory.c and run in
 * core/plan_run.c.
 */
#include "graph.h"
#include "pipeline.h" /* kiln_pipe_read_stages */

#include <stdio.h>


/* ---- model ------------------------------------------------------------ */

int kiln_model_find_layer(const struct kiln_model *m, int upto, const char *name)
{
	for (int i = 0; i < upto; i++)
		if (!strcmp(m->layers[i].name, name))
			return i;
	return -2;
}

int64_t kiln_model_loss_classes(const struct kiln_model *m)
{
	const char *lsec = m->layers[m->loss_layer].section;
	int64_t lc = 0;
	if (kiln_config_get(m->cfg, lsec, "classes"))
		kiln_config_get_int(m->cfg, lsec, "classes", &lc);
	return lc;
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
				/* a tied tensor (Y's) is laid out at its first user's
				 * place: kiln_model_tie_owner */
				const int y = k == L->tie_slot ? kiln_model_tie_owner(m, i) : i;
				if (y < 0)
					continue; /* a tied slot reads its Y's tensor */
				struct model_layer *Y = &m->layers[y];
				const int ky = y == i ? k : Y->tie_slot;
				struct kiln_param_spec *ps = &nodes[y].l.params[ky];
				int buffer = ps->is_buffer != 0;
				int tr = Y->trainable && !buffer;
				int want = buffer ? 2 : tr ? 0 : 1;
				if (want != pass)
					continue;
				struct model_param *p = &m->params[m->n_params];
				Y->pidx[ky] = m->n_params++;
				snprintf(p->name, sizeof p->name, "%s.%s", Y->name, ps->suffix);
				p->desc = ps->desc;
				p->init = ps->init;
				p->fan_in = ps->fan_in;
				p->layer = p->grad_layer = y;
				p->trainable = tr;
				p->buffer = buffer;
				p->nonneg = buffer && (ps->is_buffer & KILN_PARAM_NONNEG);
				p->slot = ky;
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
		if (!L->section || !L->name) /* freed with the model (m->n_layers counts L) */
			return kiln_error(KILN_ENOMEM, "out of memory");
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
		const char *file = kiln_registry_plugin_file(reg, L->type);
		if (file && !(L->file = kiln_strdup(file)))
			return kiln_error(KILN_ENOMEM, "out of memory");
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

kiln_status kiln_model_alloc_failed(const struct kiln_model *m, kiln_status st, const char *what,
				    size_t bytes, size_t floats)
{
	const struct model_param *big = NULL;
	char d[160] = "", size[48];
	for (int i = 0; i < m->n_params; i++)
		if (!big || m->params[i].numel > big->numel)
			big = &m->params[i];
	if (big)
		kiln_tensor_desc_str(&big->desc, d, sizeof d);
	if (bytes >= (size_t)1 << 30)
		snprintf(size, sizeof size, "%.2f GiB", (double)bytes / (1024.0 * 1024 * 1024));
	else
		snprintf(size, sizeof size, "%zu bytes", bytes);
	return kiln_error_wrap(st, "the model's %s (%s, %zu floats; the largest tensor '%s' %s)", what,
			       size, floats, big ? big->name : "-", d);
}

/* (the whole parameters' buffers: m->n_elems floats each) */
static kiln_status params_too_big(const struct kiln_model *m, kiln_status st, const char *what,
				  size_t bytes)
{
	return kiln_model_alloc_failed(m, st, what, bytes, m->n_elems);
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

/* What model_create allocates of the parameters' side: everything
 * (kiln_model_alloc_whole), nothing yet (bare), or the parameters alone
 * (a model that never trains: no gradients, no optimizer state, no tied
 * weights' gradients). */
enum { MODEL_WHOLE, MODEL_BARE, MODEL_WEIGHTS };

/* The parameters' buffer alone (MODEL_WEIGHTS): before session 37
 * inference held the gradients and optimizer state too, 3x the weights
 * under AdamW, twice over while `kiln predict` folded. */
static kiln_status alloc_weights(struct kiln_model *m)
{
	const size_t bytes = m->n_elems * sizeof(float);
	kiln_status st = kiln_device_alloc(m->dev, bytes, (void **)&m->params_d);
	if (st)
		return params_too_big(m, st, "parameters", bytes);
	m->bare = 0;
	m->weights_only = 1;
	return KILN_OK;
}

static kiln_status model_create(const struct kiln_config *cfg, const struct kiln_registry *reg,
				struct kiln_device *dev, const struct kiln_tensor_desc *sample,
				int mode, int sharded, const struct kiln_model_precheck *pre,
				struct kiln_model **out);

kiln_status kiln_model_create(const struct kiln_config *cfg, const struct kiln_registry *reg,
			      struct kiln_device *dev, const struct kiln_tensor_desc *sample,
			      struct kiln_model **out)
{
	if (!cfg || !reg || !dev || !sample || !out)
		return kiln_null_arg("kiln_model_create", !cfg ? "cfg" : !reg ? "reg" : !dev ? "dev" : !sample ? "sample" : "out");
	return model_create(cfg, reg, dev, sample, MODEL_WHOLE, 0, NULL, out);
}

kiln_status kiln_model_create_sharded(const struct kiln_config *cfg, const struct kiln_registry *reg,
				      struct kiln_device *dev, const struct kiln_tensor_desc *sample,
				      struct kiln_model **out)
{
	return model_create(cfg, reg, dev, sample, MODEL_WHOLE, 1, NULL, out);
}

kiln_status kiln_model_create_infer(const struct kiln_config *cfg, const struct kiln_registry *reg,
				    struct kiln_device *dev, const struct kiln_tensor_desc *sample,
				    const struct kiln_model_precheck *pre, struct kiln_model **out)
{
	return model_create(cfg, reg, dev, sample, MODEL_WEIGHTS, 0, pre, out);
}

kiln_status kiln_model_create_bare(const struct kiln_config *cfg, const struct kiln_registry *reg,
				   struct kiln_device *dev, const struct kiln_tensor_desc *sample,
				   struct kiln_model **out)
{
	return model_create(cfg, reg, dev, sample, MODEL_BARE, 0, NULL, out);
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
				int mode, int sharded, const struct kiln_model_precheck *pre,
				struct kiln_model **out)
{
	kiln_status st;
	*out = NULL;
	struct kiln_model *m = calloc(1, sizeof *m);
	if (!m)
		return kiln_error(KILN_ENOMEM, "out of memory");
	m->cfg = cfg;
	m->bare = 1; /* (kiln_model_alloc_whole or alloc_weights below, unless bare) */
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
	if ((st = kiln_device_alloc_named(dev, m->n_buf_elems * sizeof(float), (void **)&m->buffers_d,
					  "the model's buffers (running statistics)")) ||
	    (st = kiln_device_alloc_named(dev, 64, (void **)&m->step_d,
					  "the model's step and dropout counters")) ||
	    (st = kiln_model_optim_alloc(m)) ||
	    (mode == MODEL_WHOLE && (st = kiln_model_alloc_whole(m))) ||
	    (mode == MODEL_WEIGHTS && (st = alloc_weights(m))) ||
	    (mode != MODEL_WEIGHTS && (st = kiln_model_tie_prepare(m))))
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

kiln_status kiln_model_weights_free(struct kiln_model *m, void *stream)
{
	/* (a copy still queued on stream may read them) */
	kiln_status st = kiln_device_stream_sync(m->dev, stream);
	if (st)
		return st;
	kiln_device_free(m->dev, m->params_d);
	kiln_device_free(m->dev, m->buffers_d);
	m->params_d = m->buffers_d = NULL;
	return KILN_OK;
}

void kiln_model_free(struct kiln_model *m)
{
	if (!m)
		return;
	for (int i = 0; i < m->n_layers; i++) {
		free(m->layers[i].name);
		free(m->layers[i].section);
		free(m->layers[i].file);
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
