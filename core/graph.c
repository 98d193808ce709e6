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
	if (n->ops && n->ops->destroy)
		n->ops->destroy(kiln_host_table(), &n->l, n->planned ? dev : NULL);
	else
		free(n->l.priv);
	n->l.priv = NULL;
	(void)m;
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
				n->l.in[k] = m->sample;
				memmove(&n->l.in[k].dims[1], &m->sample.dims[0],
					sizeof(int64_t) * (KILN_MAX_DIMS - 1));
				n->l.in[k].dims[0] = batch;
				n->l.in[k].ndim = m->sample.ndim + 1;
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

static kiln_status layout_params(struct kiln_model *m, struct plan_node *nodes)
{
	int total = 0;
	for (int i = 0; i < m->n_layers; i++)
		total += nodes[i].l.n_params;
	m->params = calloc((size_t)(total ? total : 1), sizeof *m->params);
	if (!m->params)
		return kiln_error(KILN_ENOMEM, "out of memory");
	/* trainable first, so the optimizer touches one leading range */
	for (int pass = 0; pass < 2; pass++)
		for (int i = 0; i < m->n_layers; i++) {
			struct model_layer *L = &m->layers[i];
			int tr = L->trainable;
			if ((pass == 0) != (tr != 0))
				continue;
			L->first_param = m->n_params;
			L->n_params = nodes[i].l.n_params;
			for (int k = 0; k < L->n_params; k++) {
				struct kiln_param_spec *ps = &nodes[i].l.params[k];
				struct model_param *p = &m->params[m->n_params++];
				snprintf(p->name, sizeof p->name, "%s.%s", L->name, ps->suffix);
				p->desc = ps->desc;
				p->init = ps->init;
				p->fan_in = ps->fan_in;
				p->layer = i;
				p->trainable = tr;
				p->numel = kiln_tensor_numel(&ps->desc);
				p->off = m->n_elems;
				/* keep every parameter 64-byte aligned */
				m->n_elems += align_up((size_t)p->numel * 4) / 4;
				if (tr)
					m->n_trainable = m->n_elems;
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
	m->loss_layer = -1;
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
	if ((st = layout_params(m, nodes)))
		goto fail;
	for (int i = 0; i < m->n_layers; i++)
		free_node(m, &nodes[i], NULL);
	free(nodes);
	nodes = NULL;
	size_t bytes = m->n_elems * sizeof(float);
	if ((st = kiln_device_alloc(dev, bytes, (void **)&m->params_d)) ||
	    (st = kiln_device_alloc(dev, bytes, (void **)&m->grads_d)) ||
	    (st = kiln_device_alloc(dev, bytes, (void **)&m->momentum_d)))
		goto fail;
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
		kiln_device_plan_free(m->dev, m->sgd_plan);
		kiln_device_free(m->dev, m->params_d);
		kiln_device_free(m->dev, m->grads_d);
		kiln_device_free(m->dev, m->momentum_d);
	}
	free(m->layers);
	free(m->params);
	free(m);
}

int kiln_model_param_count(const struct kiln_model *m) { return m->n_params; }
size_t kiln_model_param_elems(const struct kiln_model *m) { return m->n_elems; }

void kiln_model_param_get(const struct kiln_model *m, int i, struct kiln_param_info *o)
{
	const struct model_param *p = &m->params[i];
	o->name = p->name;
	o->desc = p->desc;
	o->param = m->params_d + p->off;
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
	size_t bytes = m->n_elems * sizeof(float);
	kiln_status st = kiln_device_host_alloc(m->dev, bytes, (void **)&host);
	if (st)
		return st;
	memset(host, 0, bytes);
	for (int i = 0; i < m->n_params; i++) {
		const struct model_param *p = &m->params[i];
		float bound = p->fan_in > 0 ? 1.0f / sqrtf((float)p->fan_in) : 0.0f;
		for (int64_t e = 0; e < p->numel; e++) {
			float u = kiln_rng_uniform(seed, KILN_RNG_INIT, (uint64_t)i, (uint32_t)e);
			float v;
			switch (p->init) {
			case KILN_INIT_ONE: v = 1.0f; break;
			case KILN_INIT_KAIMING_UNIFORM:
			case KILN_INIT_BIAS_UNIFORM: v = (2.0f * u - 1.0f) * bound; break;
			default: v = 0.0f;
			}
			host[p->off + (size_t)e] = v;
		}
	}
	st = kiln_device_copy_async(m->dev, m->params_d, host, bytes, KILN_COPY_H2D, stream);
	if (!st)
		st = kiln_device_stream_sync(m->dev, stream);
	kiln_device_host_free(m->dev, host);
	return st;
}

/* ---- optimizer -------------------------------------------------------- */

kiln_status kiln_model_optim_prepare(struct kiln_model *m, void *stream)
{
	double mu = 0.9, wd = 0;
	int nesterov = 0;
	kiln_status st;
	kiln_config_get_float(m->cfg, "train", "momentum", &mu);
	kiln_config_get_float(m->cfg, "train", "weight_decay", &wd);
	kiln_config_get_bool(m->cfg, "train", "nesterov", &nesterov);
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	int64_t n = (int64_t)m->n_trainable, one = 1;
	op.type = KILN_OP_SGD;
	op.n_in = 2;
	op.n_out = 2;
	kiln_tensor_desc_init(&op.in[0], KILN_F32, 1, &n);
	kiln_tensor_desc_init(&op.in[1], KILN_F32, 1, &one);
	op.out[0] = op.out[1] = op.in[0];
	op.i[0] = n;
	op.i[1] = nesterov;
	op.f[0] = mu;
	op.f[1] = wd;
	if ((st = kiln_device_prepare(m->dev, &op, &m->sgd_plan, &m->sgd_ws)))
		return st;
	if (m->sgd_ws)
		return kiln_error(KILN_ENOTSUP, "SGD op asks for workspace; not supported");
	/* zero the momentum (and grads, so frozen or unused slots are defined) */
	void *fill;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_FILL;
	op.n_out = 1;
	int64_t all = (int64_t)m->n_elems;
	kiln_tensor_desc_init(&op.out[0], KILN_F32, 1, &all);
	op.f[0] = 0;
	if ((st = kiln_device_prepare(m->dev, &op, &fill, NULL)))
		return st;
	struct kiln_op_args a = { .out = { m->momentum_d } };
	st = kiln_device_run(m->dev, fill, &a, stream);
	a.out[0] = m->grads_d;
	if (!st)
		st = kiln_device_run(m->dev, fill, &a, stream);
	if (!st)
		st = kiln_device_stream_sync(m->dev, stream);
	kiln_device_plan_free(m->dev, fill);
	return st;
}

kiln_status kiln_model_optim_step(struct kiln_model *m, const float *lr, void *stream)
{
	if (!m->n_trainable)
		return KILN_OK;
	struct kiln_op_args a = { .in = { m->grads_d, lr }, .out = { m->params_d, m->momentum_d } };
	return kiln_device_run(m->dev, m->sgd_plan, &a, stream);
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

kiln_status kiln_model_plan(struct kiln_model *m, int64_t batch, int training,
			    struct kiln_plan **out)
{
	kiln_status st;
	int n = m->n_layers;
	*out = NULL;
	struct kiln_plan *p = calloc(1, sizeof *p);
	if (!p)
		return kiln_error(KILN_ENOMEM, "out of memory");
	p->m = m;
	p->batch = batch;
	p->training = training;
	p->nodes = calloc((size_t)n, sizeof *p->nodes);
	p->store = calloc((size_t)(2 * n), sizeof *p->store);
	int *wants_grad = calloc((size_t)n, sizeof(int));
	if (!p->nodes || !p->store || !wants_grad) {
		free(wants_grad);
		kiln_plan_free(p);
		return kiln_error(KILN_ENOMEM, "out of memory");
	}
	if ((st = infer_all(m, batch, p->nodes)))
		goto fail;
	struct plan_node *N = p->nodes;
	/* the parameters must be those the model laid out */
	for (int i = 0; i < n; i++) {
		if (N[i].l.n_params != m->layers[i].n_params) {
			st = kiln_error(KILN_EINTERNAL, "layer '%s' changed its parameters with the batch size",
					m->layers[i].name);
			goto fail;
		}
	}

	/* which outputs need a gradient: those upstream of trainable params */
	for (int i = 0; i < n; i++) {
		int w = m->layers[i].trainable && m->layers[i].n_params > 0;
		for (int k = 0; k < m->layers[i].n_in; k++)
			if (m->layers[i].in[k] >= 0 && wants_grad[m->layers[i].in[k]])
				w = 1;
		wants_grad[i] = w;
	}

	/* output storages */
	int S = 0;
	int *ys = calloc((size_t)n, sizeof(int)), *gs = calloc((size_t)n, sizeof(int));
	if (!ys || !gs) {
		free(ys);
		free(gs);
		st = kiln_error(KILN_ENOMEM, "out of memory");
		goto fail;
	}
	for (int i = 0; i < n; i++) {
		int r = store_root_y(N, m, i);
		if (N[i].l.is_loss) {
			N[i].ystore = -2;
		} else if (r == i) {
			N[i].ystore = S;
			p->store[S] = (struct storage){ kiln_tensor_bytes(&N[i].l.out), 0, i, i };
			S++;
		} else {
			N[i].ystore = r < 0 ? -1 : N[r].ystore;
		}
		ys[i] = N[i].ystore;
	}
	/* output lifetimes: consumers' forward, and backward readers */
	for (int j = 0; j < n; j++) {
		struct model_layer *L = &m->layers[j];
		if (training && N[j].l.needs_output && N[j].ystore >= 0)
			extend(&p->store[N[j].ystore], 2 * n - 1 - j);
		for (int k = 0; k < L->n_in; k++) {
			int src = L->in[k];
			if (src < 0 || N[src].ystore < 0)
				continue;
			extend(&p->store[N[src].ystore], j);
			if (training && N[j].l.needs_input)
				extend(&p->store[N[src].ystore], 2 * n - 1 - j);
		}
	}
	/* gradients: walk backward, first writer writes, later ones add */
	for (int i = 0; i < n; i++)
		gs[i] = -2;
	if (training) {
		for (int i = 0; i < n; i++) {
			int r = store_root_y(N, m, i);
			if (!wants_grad[i] || N[i].l.is_loss || r < 0) {
				N[i].gstore = -2;
			} else if (r == i) {
				N[i].gstore = S;
				p->store[S] = (struct storage){ kiln_tensor_bytes(&N[i].l.out), 0, 1 << 30, -1 };
				/* read by the producer's backward */
				extend(&p->store[S], 2 * n - 1 - i);
				S++;
			} else {
				N[i].gstore = N[r].gstore;
			}
			gs[i] = N[i].gstore;
		}
		char *written = calloc((size_t)(S ? S : 1), 1);
		if (!written) {
			free(ys);
			free(gs);
			st = kiln_error(KILN_ENOMEM, "out of memory");
			goto fail;
		}
		for (int j = n - 1; j >= 0; j--) {
			struct model_layer *L = &m->layers[j];
			for (int k = 0; k < L->n_in; k++) {
				int src = L->in[k];
				if (src < 0 || gs[src] < 0 || N[j].l.is_view)
					continue;
				N[j].dx_on[k] = 1;
				N[j].dx_accum[k] = written[gs[src]];
				written[gs[src]] = 1;
				extend(&p->store[gs[src]], 2 * n - 1 - j);
			}
		}
		free(written);
	}
	free(ys);
	free(gs);
	p->n_store = S;
	p->arena_bytes = pack(p->store, S);
	if (p->arena_bytes == (size_t)-1) {
		st = kiln_error(KILN_ENOMEM, "out of memory");
		goto fail;
	}

	/* prepare every layer's device ops; one shared workspace */
	for (int i = 0; i < n; i++) {
		size_t ws = 0;
		if (N[i].ops->plan) {
			if ((st = N[i].ops->plan(kiln_host_table(), &N[i].l, m->dev, &ws))) {
				kiln_error_wrap(st, "layer '%s' (%s), input %s", m->layers[i].name,
						m->layers[i].type->name,
						kiln_tensor_desc_str(&N[i].l.in[0], (char[96]){ 0 }, 96));
				N[i].planned = 1;
				goto fail;
			}
			N[i].planned = 1;
		}
		if (ws > p->ws_bytes)
			p->ws_bytes = ws;
	}
	if ((st = kiln_device_alloc(m->dev, p->arena_bytes, &p->arena)) ||
	    (st = kiln_device_alloc(m->dev, align_up(p->ws_bytes), &p->ws)))
		goto fail;
	free(wants_grad);
	*out = p;
	return KILN_OK;
fail:
	free(wants_grad);
	kiln_plan_free(p);
	return st;
}

void kiln_plan_free(struct kiln_plan *p)
{
	if (!p)
		return;
	for (int i = 0; p->nodes && i < p->m->n_layers; i++)
		free_node(p->m, &p->nodes[i], p->m->dev);
	kiln_device_free(p->m->dev, p->arena);
	kiln_device_free(p->m->dev, p->ws);
	free(p->nodes);
	free(p->store);
	free(p);
}

size_t kiln_plan_arena_bytes(const struct kiln_plan *p) { return p->arena_bytes; }

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

static void fill_run(struct kiln_plan *p, int i, struct kiln_layer_run *r, const void *x,
		     const void *labels, void *metrics, void *stream)
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
		r->x[k] = src < 0 ? x : ypos(p, p->nodes[src].ystore, x);
		if (p->training && nd->dx_on[k]) {
			r->dx[k] = ypos(p, p->nodes[src].gstore, x);
			r->dx_accum[k] = nd->dx_accum[k];
		}
	}
	r->y = ypos(p, nd->ystore, x);
	if (p->training)
		r->dy = ypos(p, nd->gstore, x);
	for (int k = 0; k < L->n_params; k++) {
		const struct model_param *pm = &m->params[L->first_param + k];
		r->w[k] = m->params_d + pm->off;
		r->dw[k] = p->training && pm->trainable ? m->grads_d + pm->off : NULL;
	}
	r->dw_accum = 0;
	r->workspace = p->ws;
	r->workspace_bytes = p->ws_bytes;
	r->labels = labels;
	r->metrics = metrics;
	r->grad_scale = 1.0f / (float)p->batch;
}

kiln_status kiln_plan_run(struct kiln_plan *p, const void *x, const void *labels, void *metrics,
			  void *stream)
{
	kiln_status st = kiln_plan_forward(p, x, labels, metrics, stream);
	return st ? st : kiln_plan_backward(p, x, labels, metrics, stream);
}

kiln_status kiln_plan_forward(struct kiln_plan *p, const void *x, const void *labels,
			      void *metrics, void *stream)
{
	const struct kiln_host *h = kiln_host_table();
	struct kiln_layer_run r;
	kiln_status st;
	int n = p->m->n_layers;
	for (int i = 0; i < n; i++) {
		fill_run(p, i, &r, x, labels, metrics, stream);
		if ((st = p->nodes[i].ops->forward(h, &p->nodes[i].l, &r)))
			return kiln_error_wrap(st, "forward of layer '%s'", p->m->layers[i].name);
	}
	return KILN_OK;
}

kiln_status kiln_plan_backward(struct kiln_plan *p, const void *x, const void *labels,
			       void *metrics, void *stream)
{
	const struct kiln_host *h = kiln_host_table();
	struct kiln_layer_run r;
	kiln_status st;
	int n = p->m->n_layers;
	if (!p->training)
		return KILN_OK;
	for (int i = n - 1; i >= 0; i--) {
		if (!p->nodes[i].ops->backward)
			continue;
		fill_run(p, i, &r, x, labels, metrics, stream);
		if ((st = p->nodes[i].ops->backward(h, &p->nodes[i].l, &r)))
			return kiln_error_wrap(st, "backward of layer '%s'", p->m->layers[i].name);
	}
	return KILN_OK;
}
