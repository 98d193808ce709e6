/* core/graph.c - build the model from [layer.NAME] sections, lay out the
 * flat parameter buffers, and plan: shapes, prepared device ops, gradient
 * write/accumulate decisions and the activation arena.
 *
 * Schedule.  A training plan runs forward of layer i at position i and its
 * backward at 2n-1-i.  Every activation (a "storage": a layer output, with
 * views such as flatten sharing their input's storage) lives from its
 * producer's position to its last reader's; gradients likewise from their
 * first writer in backward to the producer's backward.  Storages whose
 * lifetimes do not overlap share arena bytes.
 */
#include "graph.h"
#include "profile.h"

#include <math.h>
#include <stdio.h>

#define ALIGN 64
static size_t align_up(size_t n) { return (n + ALIGN - 1) & ~(size_t)(ALIGN - 1); }

/* ---- model ------------------------------------------------------------ */

static int find_layer(const struct kiln_model *m, int upto, const char *name)
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
	char *save = NULL;
	L->n_in = 0;
	for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		t = trim(t);
		if (L->n_in == KILN_LAYER_MAX_INPUTS)
			return kiln_error(KILN_ECONFIG, "%s: [%s] has more than %d inputs",
					  kiln_config_where(cfg, L->section, key), L->section,
					  KILN_LAYER_MAX_INPUTS);
		int j = !strcmp(t, "data") ? -1 : find_layer(m, i, t);
		if (j == -2)
			return kiln_error(KILN_ECONFIG,
					  "%s: [%s] %s = %s: no layer '%s' above this one (inputs must come earlier in the file, or be 'data')",
					  kiln_config_where(cfg, L->section, key), L->section, key,
					  one ? one : many, t);
		L->in[L->n_in++] = j;
	}
	return KILN_OK;
}

static void free_node(struct kiln_model *m, struct plan_node *n, struct kiln_device *dev)
{
	/* without destroy the layer owns nothing the core may free */
	if (n->ops && n->ops->destroy)
		n->ops->destroy(kiln_host_table(), &n->l, n->planned ? dev : NULL);
	n->l.priv = NULL;
	(void)m;
}

/* The data input as layers see it: [batch, sample...], 4-d inputs in the
 * model's layout. */
static void data_desc(const struct kiln_model *m, int64_t batch, struct kiln_tensor_desc *d)
{
	*d = m->sample;
	memmove(&d->dims[1], &m->sample.dims[0], sizeof(int64_t) * (KILN_MAX_DIMS - 1));
	d->dims[0] = batch;
	d->ndim = m->sample.ndim + 1;
	d->layout = d->ndim == 4 ? m->layout : KILN_ROW;
	if (m->cdtype != KILN_F32)
		d->dtype = m->cdtype; /* the plan converts the input */
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

/* configure + infer every layer for `batch` rows into nodes[]. */
static kiln_status infer_all(struct kiln_model *m, int64_t batch, struct plan_node *nodes)
{
	const struct kiln_host *h = kiln_host_table();
	kiln_status st;
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
		n->l.loss_scaled = m->scaler_d != NULL; /* read by loss layers only */
		n->l.sync_ranks = m->group_ranks;       /* read by batchnorm only */
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
				data_desc(m, batch, &n->l.in[k]);
			} else {
				n->l.in[k] = nodes[j].l.out;
			}
		}
		if (ops->configure &&
		    (st = ops->configure(h, &n->l, m->cfg, L->section)))
			return kiln_error_wrap(st, "layer '%s'", L->name);
		if ((st = ops->infer(h, &n->l)))
			return kiln_error_wrap(st, "layer '%s' (%s)", L->name, L->type->name);
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
	for (int pass = 0; pass < 3; pass++)
		for (int i = 0; i < m->n_layers; i++) {
			struct model_layer *L = &m->layers[i];
			for (int k = 0; k < L->n_params; k++) {
				struct kiln_param_spec *ps = &nodes[i].l.params[k];
				int buffer = ps->is_buffer != 0;
				int tr = L->trainable && !buffer;
				int want = buffer ? 2 : tr ? 0 : 1;
				if (want != pass)
					continue;
				struct model_param *p = &m->params[m->n_params];
				L->pidx[k] = m->n_params++;
				snprintf(p->name, sizeof p->name, "%s.%s", L->name, ps->suffix);
				p->desc = ps->desc;
				p->init = ps->init;
				p->fan_in = ps->fan_in;
				p->layer = i;
				p->trainable = tr;
				p->buffer = buffer;
				p->slot = k;
				p->numel = kiln_tensor_numel(&ps->desc);
				/* keep every tensor 64-byte aligned */
				size_t n = align_up((size_t)p->numel * 4) / 4;
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
	return KILN_OK;
}

kiln_status kiln_model_create(const struct kiln_config *cfg, const struct kiln_registry *reg,
			      struct kiln_device *dev, const struct kiln_tensor_desc *sample,
			      struct kiln_model **out)
{
	kiln_status st;
	*out = NULL;
	struct kiln_model *m = calloc(1, sizeof *m);
	if (!m)
		return kiln_error(KILN_ENOMEM, "out of memory");
	m->cfg = cfg;
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
	const char *layout = kiln_config_get(cfg, "model", "layout");
	m->layout = layout && !strcmp(layout, "nhwc") ? KILN_NHWC : KILN_NCHW;
	int n = 0;
	for (int i = 0; kiln_config_section(cfg, i); i++)
		n += !strncmp(kiln_config_section(cfg, i), "layer.", 6);
	if (!n) {
		kiln_model_free(m);
		return kiln_error(KILN_ECONFIG, "%s: no [layer.NAME] sections: the model is empty",
				  kiln_config_where(cfg, "run", NULL));
	}
	m->layers = calloc((size_t)n, sizeof *m->layers);
	struct plan_node *nodes = calloc((size_t)n, sizeof *nodes);
	if (!m->layers || !nodes) {
		free(nodes);
		kiln_model_free(m);
		return kiln_error(KILN_ENOMEM, "out of memory");
	}
	for (int i = 0; kiln_config_section(cfg, i); i++) {
		const char *sec = kiln_config_section(cfg, i);
		if (strncmp(sec, "layer.", 6))
			continue;
		struct model_layer *L = &m->layers[m->n_layers++];
		L->section = kiln_strdup(sec);
		L->name = kiln_strdup(sec + 6);
		const char *type = kiln_config_get(cfg, sec, "type");
		if (!type) {
			st = kiln_error(KILN_ECONFIG, "%s: [%s] needs 'type'",
					kiln_config_where(cfg, sec, NULL), sec);
			goto fail;
		}
		if ((st = kiln_registry_find(reg, KILN_PLUGIN_LAYER, type, &L->type))) {
			kiln_error_wrap(KILN_ECONFIG, "%s: [%s]", kiln_config_where(cfg, sec, "type"), sec);
			st = KILN_ECONFIG;
			goto fail;
		}
		L->trainable = 1;
		kiln_config_get_bool(cfg, sec, "trainable", &L->trainable);
		if ((st = wire_inputs(m, m->n_layers - 1, cfg)))
			goto fail;
	}
	if ((st = infer_all(m, 1, nodes)))
		goto fail;
	for (int i = 0; i < m->n_layers; i++)
		if (nodes[i].l.is_loss) {
			if (m->loss_layer >= 0) {
				st = kiln_error(KILN_ECONFIG, "%s: a second loss layer '%s' (first: '%s')",
						kiln_config_where(cfg, m->layers[i].section, "type"),
						m->layers[i].name, m->layers[m->loss_layer].name);
				goto fail;
			}
			m->loss_layer = i;
		}
	if (m->loss_layer < 0) {
		st = kiln_error(KILN_ECONFIG,
				"%s: the model has no loss layer; end it with a [layer.loss] type = softmax_xent",
				kiln_config_where(cfg, m->layers[m->n_layers - 1].section, "type"));
		goto fail;
	}
	/* every layer must lead to the loss: a dead end would get no gradient
	 * (and is almost always a wiring mistake) */
	for (int i = m->n_layers - 1; i >= 0; i--) {
		if (i == m->loss_layer)
			continue;
		int used = 0;
		for (int j = i + 1; j < m->n_layers && !used; j++)
			for (int k = 0; k < m->layers[j].n_in; k++)
				used |= m->layers[j].in[k] == i;
		if (!used) {
			st = kiln_error(KILN_ECONFIG,
					"%s: layer '%s' feeds nothing: every layer must lead to the loss (check the input = lines after it)",
					kiln_config_where(cfg, m->layers[i].section, "type"),
					m->layers[i].name);
			goto fail;
		}
	}
	if ((st = layout_params(m, nodes)))
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
		free_node(m, &nodes[i], NULL);
	free(nodes);
	nodes = NULL;
	if ((st = kiln_model_optim_configure(m, reg)))
		goto fail;
	size_t bytes = m->n_elems * sizeof(float);
	if ((st = kiln_device_alloc(dev, bytes, (void **)&m->params_d)) ||
	    (st = kiln_device_alloc(dev, bytes, (void **)&m->grads_d)) ||
	    (st = kiln_device_alloc(dev, m->n_buf_elems * sizeof(float), (void **)&m->buffers_d)) ||
	    (st = kiln_device_alloc(dev, 64, (void **)&m->step_d)) ||
	    (st = kiln_model_optim_alloc(m)))
		goto fail;
	{
		struct kiln_op op;
		int64_t one = 1;
		memset(&op, 0, sizeof op);
		op.type = KILN_OP_COUNTER_ADD;
		op.n_out = 1;
		kiln_tensor_desc_init(&op.out[0], KILN_I64, 1, &one);
		op.i[0] = 1;
		size_t cws = 0;
		if ((st = kiln_device_prepare(dev, &op, &m->step_plan, &cws)))
			goto fail;
		if (cws) {
			st = kiln_error(KILN_ENOTSUP, "the device's counter op asks for workspace");
			goto fail;
		}
	}
	*out = m;
	return KILN_OK;
fail:
	if (nodes) {
		for (int i = 0; i < m->n_layers; i++)
			free_node(m, &nodes[i], NULL);
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
	if (m->dev) {
		kiln_model_precision_close(m);
		kiln_model_optim_free(m);
		kiln_device_plan_free(m->dev, m->step_plan);
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

int kiln_model_param_count(const struct kiln_model *m) { return m->n_params; }
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
	m->pcopy_stale = 1;
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
	const struct model_param *p = &m->params[i];
	/* the caller may write the parameters: refresh the compute copy */
	((struct kiln_model *)m)->pcopy_stale = 1;
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
	return kiln_error(KILN_ENOTFOUND, "no parameter named '%s'", name);
}

kiln_status kiln_model_init_params(struct kiln_model *m, uint64_t seed, void *stream)
{
	float *host;
	size_t n = m->n_elems > m->n_buf_elems ? m->n_elems : m->n_buf_elems;
	if (n < 2)
		n = 2; /* the step counter's 8 bytes go through this buffer too */
	kiln_status st = kiln_device_host_alloc(m->dev, n * sizeof(float), (void **)&host);
	if (st)
		return st;
	for (int region = 0; region < 2 && !st; region++) {
		size_t count = region ? m->n_buf_elems : m->n_elems;
		memset(host, 0, count * sizeof(float));
		for (int i = 0; i < m->n_params; i++) {
			const struct model_param *p = &m->params[i];
			if (p->buffer != region)
				continue;
			float bound = p->fan_in > 0 ? 1.0f / sqrtf((float)p->fan_in) : 0.0f;
			/* keyed by (layer, slot, element): independent of layout
			 * order and of which layers are frozen */
			uint64_t key = (uint64_t)p->layer << 4 | (uint64_t)p->slot;
			for (int64_t e = 0; e < p->numel; e++) {
				float v;
				switch (p->init) {
				case KILN_INIT_ONE: v = 1.0f; break;
				case KILN_INIT_KAIMING_UNIFORM:
				case KILN_INIT_BIAS_UNIFORM:
					v = (2.0f * kiln_rng_uniform(seed, KILN_RNG_INIT, key, (uint32_t)e) -
					     1.0f) * bound;
					break;
				default: v = 0.0f;
				}
				host[p->off + (size_t)e] = v;
			}
		}
		st = kiln_device_copy_async(m->dev, region ? m->buffers_d : m->params_d, host,
					    count * sizeof(float), KILN_COPY_H2D, stream);
		if (!st)
			st = kiln_device_stream_sync(m->dev, stream);
	}
	m->pcopy_stale = 1;
	/* the micro-step counter starts at 0 */
	if (!st) {
		int64_t zero = 0;
		memcpy(host, &zero, sizeof zero);
		st = kiln_device_copy_async(m->dev, m->step_d, host, sizeof zero, KILN_COPY_H2D, stream);
		if (!st)
			st = kiln_device_stream_sync(m->dev, stream);
	}
	kiln_device_host_free(m->dev, host);
	return st;
}

kiln_status kiln_model_step_advance(struct kiln_model *m, void *stream)
{
	struct kiln_op_args a = { .out = { m->step_d } };
	return kiln_device_run(m->dev, m->step_plan, &a, stream);
}

/* ---- planning --------------------------------------------------------- */

static int store_root_y(struct plan_node *nodes, const struct kiln_model *m, int i)
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
					off = align_up(b->off + b->bytes);
					again = 1;
				}
			}
		}
		a->off = off;
		placed[np++] = order[oi];
		if (off + a->bytes > top)
			top = off + a->bytes;
	}
	free(order);
	free(placed);
	return align_up(top);
}

static kiln_status new_store(struct kiln_plan *p, int *cap, size_t bytes, int start, int end)
{
	if (p->n_store == *cap) {
		int nc = *cap ? *cap * 2 : 32;
		struct storage *ns = realloc(p->store, sizeof *ns * (size_t)nc);
		if (!ns)
			return kiln_error(KILN_ENOMEM, "out of memory");
		p->store = ns;
		*cap = nc;
	}
	p->store[p->n_store++] = (struct storage){ bytes, 0, start, end };
	return KILN_OK;
}

/* [train] recompute: "none" (0 segments), "auto" (-1: the planner
 * searches) or a segment count. */
static kiln_status recompute_segments(const struct kiln_model *m, int *segs)
{
	const char *v = kiln_config_get(m->cfg, "train", "recompute");
	*segs = 0;
	if (!v || !*v || !strcmp(v, "none"))
		return KILN_OK;
	if (!strcmp(v, "auto")) {
		*segs = -1; /* searched by the planner */
		return KILN_OK;
	}
	char *end;
	long n = strtol(v, &end, 10);
	if (end == v || *end || n < 1 || n > KILN_MAX_LAYERS)
		return kiln_error(KILN_ECONFIG,
				  "%s: [train] recompute = '%s': expected none, auto or a segment count 1..%d",
				  kiln_config_where(m->cfg, "train", "recompute"), v, KILN_MAX_LAYERS);
	*segs = (int)n;
	return KILN_OK;
}

/* The storage layer i's output is read from in the recomputation and the
 * backward passes: the recomputed copy when there is one. */
static int late_store(const struct kiln_plan *p, int i)
{
	if (i < 0)
		return p->data_store;
	return p->nodes[i].rstore >= 0 ? p->nodes[i].rstore : p->nodes[i].ystore;
}

static int fwd_store(const struct kiln_plan *p, int i)
{
	return i < 0 ? p->data_store : p->nodes[i].ystore;
}

/* Gradient checkpointing: decide which outputs are recomputed and lay out
 * the schedule.  With S segments (balanced by output bytes) an output is
 * recomputed when it lies in any segment but the last and only layers of
 * its own segment read it; `[layer.X] recompute = 1` asks for one layer's
 * output alone.  A recomputed output is computed again just before the
 * first backward (or recomputation) that reads it, so the recomputations
 * of a segment run in layer order right before its first backward needs
 * them.  Sets nodes[].trig, pos_r, pos_b and p->sched. */
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
		if (N[i].l.is_loss || N[i].l.is_view || store_root_y(N, m, i) != i)
			continue;
		int inside = S > 1 && seg[i] < S - 1;
		for (int j = i + 1; j < n && inside; j++)
			for (int k = 0; k < m->layers[j].n_in; k++)
				if (store_root_y(N, m, m->layers[j].in[k]) == i && seg[j] != seg[i])
					inside = 0;
		rec[i] = inside || own;
	}
	/* triggers, last layer first: a recomputed output is needed by its
	 * own backward (needs_output), by readers' backwards (needs_input)
	 * and by readers' recomputations */
	for (int i = 0; i < n; i++)
		N[i].trig = -1;
	for (int j = n - 1; j >= 0; j--) {
		if (rec[j] && N[j].l.needs_output && j > N[j].trig)
			N[j].trig = j;
		for (int k = 0; k < m->layers[j].n_in; k++) {
			int r = store_root_y(N, m, m->layers[j].in[k]);
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
	S[mine].bytes = 0; /* unused now */
	S[mine].start = 0;
	S[mine].end = 0;
	for (int k = 0; k < p->m->n_layers; k++) {
		if (p->nodes[k].ystore == mine)
			p->nodes[k].ystore = theirs;
		if (p->nodes[k].rstore == mine)
			p->nodes[k].rstore = theirs;
	}
	return 1;
}

/* Storages, lifetimes and arena size of plan p with S recompute segments
 * (0: none): everything after the layers' device ops are prepared.  May
 * run several times on one plan (`recompute = auto` tries segment counts);
 * storages past the first `base` are laid out again each time. */
static kiln_status plan_memory(struct kiln_plan *p, int S, const int *wants_grad, int base)
{
	struct kiln_model *m = p->m;
	struct plan_node *N = p->nodes;
	const int n = m->n_layers, training = p->training;
	int cap = p->n_store; /* the array holds at least this many */
	char *written = NULL;
	kiln_status st;
	p->n_store = base;
	for (int i = 0; i < base; i++) /* the reordered input, written first */
		p->store[i].start = p->store[i].end = 0;
	free(p->sched);
	p->sched = NULL;
	p->data_gstore = -2;
	for (int i = 0; i < n; i++)
		for (int k = 0; k < KILN_LAYER_MAX_INPUTS; k++)
			N[i].dx_on[k] = N[i].dx_accum[k] = 0;
	if ((st = plan_schedule(p, S)))
		goto fail;
	const int END = p->n_pos; /* past the last schedule position */

	/* output storages (views share their input's); a recomputed output
	 * has a second storage for its recomputed copy, and so does what its
	 * forward keeps for the backward */
	for (int i = 0; i < n; i++) {
		int r = store_root_y(N, m, i);
		const int rec = N[i].trig >= 0;
		N[i].rstore = N[i].rsstore = -2;
		if (N[i].l.is_loss) {
			N[i].ystore = -2;
		} else if (r == i) {
			N[i].ystore = p->n_store;
			if ((st = new_store(p, &cap, kiln_tensor_bytes(&N[i].l.out), i, i)))
				goto fail;
			if (rec) {
				N[i].rstore = p->n_store;
				if ((st = new_store(p, &cap, kiln_tensor_bytes(&N[i].l.out), N[i].pos_r,
						    N[i].pos_r)))
					goto fail;
			}
		} else {
			N[i].ystore = r < 0 ? p->data_store : N[r].ystore;
			N[i].rstore = r < 0 ? -2 : N[r].rstore;
		}
		N[i].sstore = -2;
		if (training && N[i].l.saved_bytes) {
			N[i].sstore = p->n_store;
			if ((st = new_store(p, &cap, N[i].l.saved_bytes, i, rec ? i : N[i].pos_b)))
				goto fail;
			if (rec) {
				N[i].rsstore = p->n_store;
				if ((st = new_store(p, &cap, N[i].l.saved_bytes, N[i].pos_r, N[i].pos_b)))
					goto fail;
			}
		}
	}
	/* output lifetimes: readers' forwards read the forward copy;
	 * recomputations and backwards read the late copy */
	for (int j = 0; j < n; j++) {
		struct model_layer *L = &m->layers[j];
		int ls = late_store(p, j);
		if (training && N[j].l.needs_output && ls >= 0)
			extend(&p->store[ls], N[j].pos_b);
		for (int k = 0; k < L->n_in; k++) {
			int fs = fwd_store(p, L->in[k]);
			if (fs >= 0)
				extend(&p->store[fs], j);
			if (!training || (ls = late_store(p, L->in[k])) < 0)
				continue;
			if (N[j].l.needs_input)
				extend(&p->store[ls], N[j].pos_b);
			if (N[j].trig >= 0)
				extend(&p->store[ls], N[j].pos_r);
		}
	}
	/* in place: a layer that may overwrite an input (inplace_ok bit k)
	 * takes that input's storage when nothing reads the input after this
	 * layer's forward (its lifetime ends here) and the sizes match; the
	 * same again for a recomputed copy at its recomputation.  Decided
	 * from the lifetimes alone, so the arithmetic is unchanged. */
	for (int i = 0; i < n; i++) {
		int allow = 1, fwd = 0, late = N[i].rstore < 0;
		kiln_config_get_bool(m->cfg, m->layers[i].section, "inplace", &allow);
		if (!allow || !N[i].l.inplace_ok || N[i].l.is_view || store_root_y(N, m, i) != i)
			continue;
		for (int k = 0; k < m->layers[i].n_in; k++) {
			int src = m->layers[i].in[k];
			if (src < 0 || !(N[i].l.inplace_ok >> k & 1))
				continue;
			if (!fwd && (fwd = merge_in_place(p, N[i].ystore, fwd_store(p, src), i)))
				kiln_log(KILN_LOG_DEBUG, "core", "layer '%s' runs in place on '%s''s output",
					 m->layers[i].name, m->layers[src].name);
			if (!late)
				late = merge_in_place(p, N[i].rstore, late_store(p, src), N[i].pos_r);
		}
	}
	/* gradients: walk backward, first writer writes, later ones add */
	for (int i = 0; i < n; i++)
		N[i].gstore = -2;
	if (training) {
		if (p->input_grad) {
			p->data_gstore = p->n_store;
			if ((st = new_store(p, &cap, kiln_tensor_bytes(&p->data_desc), 1 << 30, END)))
				goto fail;
		}
		for (int i = 0; i < n; i++) {
			int r = store_root_y(N, m, i);
			if (!wants_grad[i] || N[i].l.is_loss) {
				N[i].gstore = -2;
			} else if (r == i) {
				N[i].gstore = p->n_store;
				if ((st = new_store(p, &cap, kiln_tensor_bytes(&N[i].l.out), 1 << 30, -1)))
					goto fail;
				/* read by the producer's backward */
				extend(&p->store[N[i].gstore], N[i].pos_b);
			} else {
				N[i].gstore = r < 0 ? p->data_gstore : N[r].gstore;
			}
		}
		written = calloc((size_t)(p->n_store ? p->n_store : 1), 1);
		if (!written) {
			st = kiln_error(KILN_ENOMEM, "out of memory");
			goto fail;
		}
		for (int j = n - 1; j >= 0; j--) {
			struct model_layer *L = &m->layers[j];
			for (int k = 0; k < L->n_in; k++) {
				int src = L->in[k];
				int gs = src < 0 ? p->data_gstore : N[src].gstore;
				if (gs < 0 || N[j].l.is_view)
					continue;
				N[j].dx_on[k] = 1;
				N[j].dx_accum[k] = written[gs];
				written[gs] = 1;
				extend(&p->store[gs], N[j].pos_b);
			}
		}
	}
	for (int j = 0; j < n && training; j++) {
		for (int k = 0; k < m->layers[j].n_in; k++) {
			if (N[j].dx_on[k] && !N[j].ops->backward) {
				st = kiln_error(KILN_ENOTSUP,
						"layer '%s' (%s) has no backward, but its input '%s' needs a gradient",
						m->layers[j].name, m->layers[j].type->name,
						m->layers[j].in[k] < 0 ? "data" : m->layers[m->layers[j].in[k]].name);
				goto fail;
			}
		}
		if (N[j].l.is_loss && N[j].dx_accum[0]) {
			st = kiln_error(KILN_ECONFIG,
					"%s: the logits of loss layer '%s' are also read by a later layer; the loss must be their last reader",
					kiln_config_where(m->cfg, m->layers[j].section, "type"),
					m->layers[j].name);
			goto fail;
		}
	}
	for (int i = 0; i < p->n_store; i++)
		if (p->store[i].bytes && p->store[i].start > p->store[i].end) {
			st = kiln_error(KILN_EINTERNAL, "planner: storage %d has no lifetime", i);
			goto fail;
		}
	if (p->keep_all)
		for (int i = 0; i < p->n_store; i++)
			p->store[i].start = 0, p->store[i].end = END;
	p->arena_bytes = pack(p->store, p->n_store);
	if (p->arena_bytes == (size_t)-1) {
		st = kiln_error(KILN_ENOMEM, "out of memory");
		goto fail;
	}
	free(written);
	return KILN_OK;
fail:
	free(written);
	return st;
}

kiln_status kiln_model_plan(struct kiln_model *m, int64_t batch, int training,
			    struct kiln_plan **out)
{
	struct kiln_plan_opts o = { .training = training };
	return kiln_model_plan_ex(m, batch, &o, out);
}

kiln_status kiln_model_plan_ex(struct kiln_model *m, int64_t batch,
			       const struct kiln_plan_opts *opts, struct kiln_plan **out)
{
	kiln_status st;
	int n = m->n_layers, cap = 0;
	const int training = opts->training;
	*out = NULL;
	struct kiln_plan *p = calloc(1, sizeof *p);
	if (!p)
		return kiln_error(KILN_ENOMEM, "out of memory");
	p->m = m;
	p->batch = batch;
	p->training = training;
	p->input_grad = training && opts->input_grad;
	p->keep_all = opts->keep_all;
	p->data_gstore = -2;
	p->data_store = -1;
	p->nodes = calloc((size_t)n, sizeof *p->nodes);
	int *wants_grad = calloc((size_t)n, sizeof(int));
	char *written = NULL;
	if (!p->nodes || !wants_grad) {
		st = kiln_error(KILN_ENOMEM, "out of memory");
		goto fail;
	}
	if ((st = infer_all(m, batch, p->nodes)))
		goto fail;
	struct plan_node *N = p->nodes;
	data_desc(m, batch, &p->data_desc);
	for (int i = 0; i < n; i++)
		if (N[i].l.n_params != m->layers[i].n_params) {
			st = kiln_error(KILN_EINTERNAL, "layer '%s' changed its parameters with the batch size",
					m->layers[i].name);
			goto fail;
		}

	/* prepare every layer's device ops (sets saved_bytes); one shared
	 * workspace */
	for (int i = 0; i < n; i++) {
		size_t ws = 0;
		N[i].l.saved_bytes = 0;
		if (N[i].ops->plan) {
			N[i].planned = 1;
			if ((st = N[i].ops->plan(kiln_host_table(), &N[i].l, m->dev, &ws))) {
				char d[96];
				kiln_error_wrap(st, "layer '%s' (%s), input %s", m->layers[i].name,
						m->layers[i].type->name,
						kiln_tensor_desc_str(&N[i].l.in[0], d, sizeof d));
				goto fail;
			}
		}
		if (ws > p->ws_bytes)
			p->ws_bytes = ws;
	}
	/* NHWC with several input channels: the data arrives as NCHW and is
	 * reordered into the arena before the first layer; low-precision
	 * compute: converted into the arena (both at once when both) */
	struct kiln_tensor_desc raw = p->data_desc;
	raw.dtype = m->sample.dtype;
	const int reorder = p->data_desc.layout == KILN_NHWC && p->data_desc.dims[1] > 1;
	if (reorder || raw.dtype != p->data_desc.dtype) {
		struct kiln_op op;
		memset(&op, 0, sizeof op);
		op.type = reorder ? KILN_OP_REORDER : KILN_OP_CAST;
		op.n_in = op.n_out = 1;
		op.in[0] = raw;
		op.out[0] = p->data_desc;
		if (reorder)
			op.in[0].layout = KILN_NCHW;
		size_t rws = 0;
		if ((st = kiln_device_prepare(m->dev, &op, reorder ? &p->in_reorder : &p->in_cast,
					      &rws)))
			goto fail;
		if (rws > p->ws_bytes)
			p->ws_bytes = rws;
		p->data_store = p->n_store;
		if ((st = new_store(p, &cap, kiln_tensor_bytes(&p->data_desc), 0, 0)))
			goto fail;
	}

	/* which outputs need a gradient: those upstream of trainable params,
	 * and everything when the data's gradient is asked for */
	for (int i = 0; i < n; i++) {
		int w = (m->layers[i].trainable && m->layers[i].n_params > 0) || p->input_grad;
		for (int k = 0; k < m->layers[i].n_in; k++)
			if (m->layers[i].in[k] >= 0 && wants_grad[m->layers[i].in[k]])
				w = 1;
		wants_grad[i] = w;
	}

	/* gradient checkpointing: `auto` tries every segment count and keeps
	 * the smallest arena (the fewest segments among equals) */
	int S = 0, base = p->n_store;
	if (training && (st = recompute_segments(m, &S)))
		goto fail;
	if (S < 0) {
		size_t best = (size_t)-1;
		int best_s = 0;
		for (int t = 0; t <= n; t += t ? 1 : 2) {
			if ((st = plan_memory(p, t, wants_grad, base)))
				goto fail;
			if (p->arena_bytes < best)
				best = p->arena_bytes, best_s = t;
		}
		S = best_s;
	}
	if ((st = plan_memory(p, S, wants_grad, base)))
		goto fail;
	if (p->n_recomputed)
		kiln_log(KILN_LOG_INFO, "core",
			 "recompute: %d segments, %d layers' outputs recomputed in the backward; activations %.2f MiB",
			 S, p->n_recomputed, (double)p->arena_bytes / 1048576.0);
	if (!opts->dry && ((st = kiln_device_alloc(m->dev, p->arena_bytes, &p->arena)) ||
			   (st = kiln_device_alloc(m->dev, align_up(p->ws_bytes), &p->ws))))
		goto fail;
	free(wants_grad);
	free(written);
	*out = p;
	return KILN_OK;
fail:
	free(wants_grad);
	free(written);
	kiln_plan_free(p);
	return st;
}

kiln_status kiln_plan_tensor(const struct kiln_plan *p, const char *layer, const char *which,
			     void **ptr, struct kiln_tensor_desc *desc)
{
	int store = -2;
	if (!layer) {
		if (strcmp(which, "dx"))
			return kiln_error(KILN_ENOTFOUND, "the data input has only 'dx'");
		store = p->data_gstore;
		*desc = p->data_desc;
	} else {
		int i = find_layer(p->m, p->m->n_layers, layer);
		if (i < 0)
			return kiln_error(KILN_ENOTFOUND, "no layer '%s'", layer);
		store = !strcmp(which, "y") ? p->nodes[i].ystore : !strcmp(which, "dy") ? p->nodes[i].gstore : -2;
		*desc = p->nodes[i].l.out;
	}
	if (store < 0)
		return kiln_error(KILN_ENOTFOUND, "plan keeps no '%s' for %s%s", which,
				  layer ? "layer " : "the data input", layer ? layer : "");
	*ptr = (char *)p->arena + p->store[store].off;
	return KILN_OK;
}

void kiln_plan_free(struct kiln_plan *p)
{
	if (!p)
		return;
	for (int i = 0; p->nodes && i < p->m->n_layers; i++)
		free_node(p->m, &p->nodes[i], p->m->dev);
	kiln_device_free(p->m->dev, p->arena);
	kiln_device_free(p->m->dev, p->ws);
	if (p->in_reorder)
		kiln_device_plan_free(p->m->dev, p->in_reorder);
	if (p->in_cast)
		kiln_device_plan_free(p->m->dev, p->in_cast);
	free(p->nodes);
	free(p->store);
	free(p->sched);
	free(p);
}

size_t kiln_plan_arena_bytes(const struct kiln_plan *p) { return p->arena_bytes; }
int kiln_plan_recomputed(const struct kiln_plan *p) { return p->n_recomputed; }

size_t kiln_plan_naive_bytes(const struct kiln_plan *p)
{
	size_t t = 0;
	for (int i = 0; i < p->n_store; i++)
		t += align_up(p->store[i].bytes);
	return t;
}

static void *ypos(struct kiln_plan *p, int store, const void *x)
{
	if (store == -1)
		return (void *)x;
	if (store < 0)
		return NULL;
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
	r->dev = m->dev;
	r->stream = stream;
	r->training = p->training;
	r->batch = p->batch;
	for (int k = 0; k < L->n_in; k++) {
		int src = L->in[k];
		r->x[k] = ypos(p, late ? late_store(p, src) : fwd_store(p, src), x);
		if (p->training && nd->dx_on[k]) {
			r->dx[k] = ypos(p, src < 0 ? p->data_gstore : p->nodes[src].gstore, x);
			r->dx_accum[k] = nd->dx_accum[k];
		}
	}
	r->y = ypos(p, late ? late_store(p, i) : nd->ystore, x);
	if (p->training)
		r->dy = ypos(p, nd->gstore, x);
	for (int k = 0; k < L->n_params; k++) {
		const struct model_param *pm = &m->params[L->pidx[k]];
		r->w[k] = (pm->buffer ? m->buffers_d : m->params_d) + pm->off;
		if (m->params_c && !pm->buffer)
			r->wc[k] = (char *)m->params_c + pm->off * kiln_dtype_size(m->cdtype);
		r->dw[k] = p->training && pm->trainable
				   ? (m->grad_out_d ? m->grad_out_d : m->grads_d) + pm->off
				   : NULL;
	}
	r->dw_accum = 0;
	r->workspace = p->ws;
	r->workspace_bytes = p->ws_bytes;
	r->labels = labels;
	r->metrics = metrics;
	r->grad_scale = 1.0f / (float)p->batch;
	int ss = late && nd->rsstore >= 0 ? nd->rsstore : nd->sstore;
	r->saved = ss >= 0 ? ypos(p, ss, x) : NULL;
	r->step = m->step_d;
	r->loss_scale = m->scaler_d; /* the scale is element 0 */
	r->group = p->training && m->group_ranks > 1 ? m->group : NULL;
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

kiln_status kiln_plan_forward(struct kiln_plan *p, const void *x, const void *labels,
			      void *metrics, void *stream)
{
	struct kiln_profile *prof = kiln_device_profile(p->m->dev);
	struct kiln_layer_run r;
	kiln_status st;
	struct kiln_model *m = p->m;
	int n = m->n_layers;
	/* the compute copy's refresh reads every parameter */
	if (m->fwd_hook && m->pcopy_stale && m->pcast_plan &&
	    (st = m->fwd_hook(m->fwd_user, n, stream)))
		return st;
	if ((st = kiln_model_params_sync(m, stream)))
		return kiln_error_wrap(st, "the compute copy of the parameters");
	if (p->in_reorder || p->in_cast) {
		struct kiln_op_args a = { .in = { x }, .out = { ypos(p, p->data_store, x) },
					  .workspace = p->ws, .workspace_bytes = p->ws_bytes };
		if (prof)
			kiln_profile_label("input", KILN_PHASE_FORWARD);
		st = kiln_device_run(p->m->dev, p->in_reorder ? p->in_reorder : p->in_cast, &a, stream);
		if (prof)
			kiln_profile_label(NULL, 0);
		if (st)
			return kiln_error_wrap(st, "converting the input to the model's layout and dtype");
	}
	for (int i = 0; i < n; i++) {
		if (m->fwd_hook && (st = m->fwd_hook(m->fwd_user, i, stream)))
			return st;
		fill_run(p, i, &r, x, labels, metrics, stream, 0);
		if ((st = run_node(p, i, KILN_PHASE_FORWARD, &r, prof)))
			return kiln_error_wrap(st, "forward of layer '%s'", p->m->layers[i].name);
	}
	return KILN_OK;
}

/* The schedule after the forwards: backwards in reverse layer order, each
 * preceded by the recomputations it needs. */
kiln_status kiln_plan_backward(struct kiln_plan *p, const void *x, const void *labels,
			       void *metrics, void *stream)
{
	struct kiln_profile *prof = kiln_device_profile(p->m->dev);
	struct kiln_layer_run r;
	kiln_status st;
	if (!p->training)
		return KILN_OK;
	for (int e = p->m->n_layers; e < p->n_pos; e++) {
		const int i = p->sched[e].layer;
		if (p->sched[e].kind == PEV_RECOMPUTE) {
			fill_run(p, i, &r, x, labels, metrics, stream, 1);
			r.recompute = 1;
			if ((st = run_node(p, i, KILN_PROF_RECOMPUTE, &r, prof)))
				return kiln_error_wrap(st, "recomputing layer '%s'", p->m->layers[i].name);
			continue;
		}
		if (p->nodes[i].ops->backward) {
			fill_run(p, i, &r, x, labels, metrics, stream, 1);
			if ((st = run_node(p, i, KILN_PHASE_BACKWARD, &r, prof)))
				return kiln_error_wrap(st, "backward of layer '%s'", p->m->layers[i].name);
		}
		if (p->m->bwd_hook && (st = p->m->bwd_hook(p->m->bwd_user, i, stream)))
			return st;
	}
	return KILN_OK;
}
