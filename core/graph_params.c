/* core/graph_params.c - a built model's parameters: the compute-dtype
 * copy, access by index or name, the initial values (PyTorch's default
 * init, drawn per tensor from the run's seed) and the non-finite check of
 * loaded values.  They are laid out in core/graph.c.
 */
#include "graph.h"

#include <math.h>

int kiln_model_param_count(const struct kiln_model *m) { return m ? m->n_params : 0; }
int kiln_model_compute_dtype(const struct kiln_model *m) { return m->cdtype; }

/* The speed guides' rule: tensor-core (and AVX512-BF16) GEMMs and
 * convolutions want dimensions that are multiples of 8.  Said for the
 * weights the layers that compute in dtype read (kiln_node_low_precision,
 * the layers inferred with it at batch 1; a tied weight by the layer that
 * multiplies by it: GPT's lm_head reading the embedding's), each once,
 * not for an lstm's, a gru's (f32 only) or an embedding's (a lookup):
 * before session 41 every parameter of 2 or more dimensions was named.
 * A model that does not infer says nothing here: its plan names the
 * error. */
static void warn_dims(struct kiln_model *m, int dtype)
{
	struct plan_node *nodes = calloc((size_t)m->n_layers, sizeof *nodes);
	unsigned char *said = calloc((size_t)m->n_params + 1, 1);
	struct kiln_tensor_desc data;
	kiln_model_data_desc(m, 1, &data);
	const int ok = nodes && said && !kiln_model_infer(m, &data, 0, KILN_FUSE_NONE, nodes);
	for (int i = 0; ok && i < m->n_layers; i++)
		for (int j = 0; kiln_node_low_precision(&nodes[i], dtype) && j < m->layers[i].n_params; j++) {
			const struct model_param *pm = &m->params[m->layers[i].pidx[j]];
			int64_t k = 1;
			for (int d = 1; d < pm->desc.ndim; d++)
				k *= pm->desc.dims[d];
			if (pm->buffer || pm->desc.ndim < 2 || said[m->layers[i].pidx[j]] ||
			    (pm->desc.dims[0] % 8 == 0 && k % 8 == 0))
				continue;
			said[m->layers[i].pidx[j]] = 1;
			kiln_log(KILN_LOG_WARN, "core",
				 "%s: %s compute with %s [%lld outputs, %lld inputs per output]: not multiples of 8, so the low-precision matrix kernels run below their best",
				 m->layers[i].name, kiln_dtype_name(dtype), pm->name,
				 (long long)pm->desc.dims[0], (long long)k);
		}
	for (int i = 0; nodes && i < m->n_layers; i++)
		kiln_plan_node_free(&nodes[i], NULL);
	free(nodes);
	free(said);
}

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
	warn_dims(m, dtype);
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
	/* the caller may write the parameters before the next run: one write
	 * counted now (the compute copy cast again, frozen plans' kept
	 * weights made again, once).  A write through the pointer after a
	 * run is the caller's to tell: kiln_model_params_written (kiln.h) */
	kiln_model_weights_written((struct kiln_model *)m);
	o->name = p->name;
	o->desc = p->desc;
	o->param = (p->buffer ? m->buffers_d : m->params_d) + p->off;
	o->grad = p->trainable && m->grads_d ? m->grads_d + p->off : NULL;
	o->trainable = p->trainable;
}

void kiln_model_params_written(struct kiln_model *m)
{
	if (!m)
		return;
	kiln_model_weights_written(m);
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

/* The Philox coordinate a of element e of parameter p: the tensor's key
 * (layer << 4 | slot: below 2^36) with e's high word above bit 36; b is
 * e's low word.  The high word is 0 in every tensor under 2^32 elements,
 * which so draw exactly what they drew before session 38, when e was cut
 * to 32 bits and a larger tensor repeated its values every 2^32 elements
 * (an embedding of 2^32 + 1 elements began again at element 2^32).
 * Distinct for e < 2^60. */
static uint64_t init_key(const struct model_param *p, int64_t e)
{
	return ((uint64_t)p->layer << 4 | (uint64_t)p->slot) | ((uint64_t)e >> 32) << 36;
}

/* The initial value of element e of parameter p: PyTorch's default init,
 * keyed by (layer, slot, element): independent of layout order, of which
 * layers are frozen and of which other parameters are drawn. */
float kiln_param_init_value(const struct model_param *p, uint64_t seed, int64_t e)
{
	float bound = p->fan_in > 0 ? 1.0f / sqrtf((float)p->fan_in) : 0.0f;
	const uint64_t key = init_key(p, e);
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

/* Elements [e0, e0 + n) of p's initial values into v: kiln_param_init_value's,
 * the uniform draws LANES at a time (kiln_rng_uniform_run, bit for bit the
 * same numbers: most of a run's set-up before this was Philox one element
 * at a time, about 30 ms for the CNN's 3.3 M weights), one run for each
 * 2^32 elements (init_key's high word), whose b does not wrap. */
void kiln_param_init_run(const struct model_param *p, uint64_t seed, int64_t e0, int64_t n,
			 float *v)
{
	if (p->init != KILN_INIT_KAIMING_UNIFORM && p->init != KILN_INIT_BIAS_UNIFORM) {
		for (int64_t k = 0; k < n; k++)
			v[k] = kiln_param_init_value(p, seed, e0 + k);
		return;
	}
	const float bound = p->fan_in > 0 ? 1.0f / sqrtf((float)p->fan_in) : 0.0f;
	for (int64_t e = e0; e < e0 + n;) {
		const int64_t next = (int64_t)(((uint64_t)e >> 32) + 1) << 32;
		const int64_t end = next < e0 + n ? next : e0 + n;
		kiln_rng_uniform_run(seed, KILN_RNG_INIT, init_key(p, e), (uint32_t)e, end - e,
				     v + (e - e0));
		e = end;
	}
	for (int64_t k = 0; k < n; k++)
		v[k] = (2.0f * v[k] - 1.0f) * bound;
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
 * the draws of one process (kiln_param_init_value's keys are the tensors' own). */
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
		kiln_param_init_run(p, seed, 0, p->numel, host + off);
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
	if (st) /* (it said "cpu: alloc of N bytes failed" alone before session 41) */
		return kiln_model_alloc_failed(m, st, "host buffer for drawing its initial weights",
					       n * sizeof(float), n);
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

/* The first tensor (index into m->params) of region whose values in v
 * (elements [off, off + n)) hold a bad one, *at its element in that
 * tensor; -1 when none does.  Bad: not finite, or with nonneg, negative in
 * a tensor that must be >= 0 (KILN_PARAM_NONNEG). */
static int model_bad_value(const struct kiln_model *m, int region, size_t off, const float *v,
			   size_t n, int nonneg, int64_t *at)
{
	for (int i = 0; i < m->n_params; i++) {
		const struct model_param *p = &m->params[i];
		const size_t lo = p->off > off ? p->off : off;
		const size_t hi = p->off + (size_t)p->numel < off + n ? p->off + (size_t)p->numel
								      : off + n;
		if (!p->buffer != !region || (nonneg && !p->nonneg))
			continue;
		for (size_t e = lo; e < hi; e++)
			if (nonneg ? v[e - off] < 0 : !isfinite(v[e - off])) {
				*at = (int64_t)(e - p->off);
				return i;
			}
	}
	return -1;
}

int kiln_model_nonfinite(const struct kiln_model *m, int region, size_t off, const float *v,
			 size_t n, int64_t *at)
{
	return model_bad_value(m, region, off, v, n, 0, at);
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
	if ((i = model_bad_value(m, region, off, v, n, 1, &at)) < 0)
		return KILN_OK;
	kiln_tensor_desc_str(&m->params[i].desc, shape, sizeof shape);
	return kiln_error(KILN_EDATA, "%s: tensor '%s' %s holds a negative variance (%g at element %lld): refused (its square root is NaN: every output of the layer would be NaN)",
			  file, m->params[i].name, shape, (double)v[(size_t)at + m->params[i].off - off],
			  (long long)at);
}
