/* core/generate.c - text generation (`kiln generate`, docs/generate.md):
 * a decode plan of the model at batch 1 (core/plan.c, kiln_plan_opts.decode)
 * fed one token per step, the attention layers' keys and values of the
 * earlier positions kept in the plan's caches, so no step recomputes the
 * prefix; the next token drawn from the logits with temperature and top-k
 * by the core's counter-based RNG (core/rng.c), so a seed gives the same
 * text on any machine and thread count.
 */
#include "graph.h"

#include <math.h>
#include <stdio.h>

struct kiln_generator {
	struct kiln_trained t;  /* what kiln_generator_open loaded (t.m NULL: borrowed) */
	struct kiln_model *m;
	void *stream;
	struct kiln_plan *p;
	int64_t context, vocab;
	int32_t *io_d;          /* device i32[2]: the token, its position */
	void *logits_d;         /* the plan's logits [1, 1, V] */
	float *logits32_d;      /* ... widened to f32 (low-precision compute), or NULL */
	void *cast;             /* that CAST, or NULL */
	float *logits;          /* host f32[V] */
};

kiln_status kiln_generator_new(struct kiln_model *m, void *stream, int64_t context,
			       struct kiln_generator **out)
{
	struct kiln_generator *g = calloc(1, sizeof *g);
	struct kiln_plan_opts o = { .decode = context };
	struct kiln_tensor_desc d;
	kiln_status st;
	*out = NULL;
	if (!g)
		return kiln_error(KILN_ENOMEM, "out of memory");
	g->m = m;
	g->stream = stream;
	g->context = context;
	if ((st = kiln_model_plan_ex(m, 1, &o, &g->p)) || (st = kiln_plan_logits(g->p, &g->logits_d, &d)) ||
	    (st = kiln_device_alloc(m->dev, 2 * sizeof(int32_t), (void **)&g->io_d)))
		goto fail;
	g->vocab = d.dims[d.ndim - 1];
	if (d.dtype != KILN_F32) { /* widen low-precision logits on the device */
		struct kiln_op op;
		memset(&op, 0, sizeof op);
		op.type = KILN_OP_CAST;
		op.n_in = op.n_out = 1;
		op.in[0] = d;
		op.out[0] = d;
		op.out[0].dtype = KILN_F32;
		if ((st = kiln_device_prepare(m->dev, &op, &g->cast, NULL)) ||
		    (st = kiln_device_alloc(m->dev, sizeof(float) * (size_t)g->vocab,
					    (void **)&g->logits32_d)))
			goto fail;
	}
	g->logits = malloc(sizeof(float) * (size_t)g->vocab);
	if (!g->logits) {
		st = kiln_error(KILN_ENOMEM, "out of memory");
		goto fail;
	}
	*out = g;
	return KILN_OK;
fail:
	kiln_generator_close(g);
	return st;
}

kiln_status kiln_generator_open(const struct kiln_config *cfg, const struct kiln_registry *reg,
				const char *checkpoint, struct kiln_generator **out)
{
	if (!cfg || !reg || !out)
		return kiln_null_arg("kiln_generator_open", !cfg ? "cfg" : !reg ? "reg" : "out");
	struct kiln_trained t;
	*out = NULL;
	kiln_status st = kiln_trained_open(cfg, reg, checkpoint, "generating with", 1, &t);
	if (st)
		return st;
	if (t.sample.dtype != KILN_I32 || t.sample.ndim != 1) {
		kiln_trained_close(&t);
		return kiln_error(KILN_ECONFIG, "%s: generation needs a model on token sequences ([data] source = tokens), not %s samples",
				  kiln_config_where(cfg, "data", "source"), kiln_dtype_name(t.sample.dtype));
	}
	/* the context: the sequence length the model was trained on (the
	 * checkpoint's record; a [data] context that differs is warned of
	 * and not used, kiln_trained_open) */
	if ((st = kiln_generator_new(t.m, t.stream, t.sample.dims[0], out))) {
		kiln_trained_close(&t);
		return st;
	}
	(*out)->t = t;
	return KILN_OK;
}

void kiln_generator_close(struct kiln_generator *g)
{
	if (!g)
		return;
	struct kiln_device *dev = g->m->dev;
	if (g->stream)
		kiln_device_stream_sync(dev, g->stream);
	kiln_plan_free(g->p);
	if (g->cast)
		kiln_device_plan_free(dev, g->cast);
	kiln_device_free(dev, g->logits32_d);
	kiln_device_free(dev, g->io_d);
	free(g->logits);
	if (g->t.m)
		kiln_trained_close(&g->t);
	free(g);
}

int64_t kiln_generator_context(const struct kiln_generator *g) { return g ? g->context : 0; }
int64_t kiln_generator_vocab(const struct kiln_generator *g) { return g ? g->vocab : 0; }

kiln_status kiln_generator_step(struct kiln_generator *g, int64_t pos, int32_t token,
				const float **logits)
{
	struct kiln_device *dev = g->m->dev;
	const int32_t io[2] = { token, (int32_t)pos };
	kiln_status st;
	if (pos < 0 || pos >= g->context)
		return kiln_error(KILN_EINVAL, "position %lld outside the model's context of %lld tokens",
				  (long long)pos, (long long)g->context);
	if (token < 0)
		return kiln_error(KILN_EINVAL, "token id %d at position %lld is negative", token,
				  (long long)pos);
	if ((st = kiln_device_copy_async(dev, g->io_d, io, sizeof io, KILN_COPY_H2D, g->stream)) ||
	    (st = kiln_plan_decode(g->p, g->io_d, g->io_d + 1, g->stream)))
		return kiln_error_wrap(st, "decoding position %lld", (long long)pos);
	const void *src = g->logits_d;
	if (g->cast) {
		struct kiln_op_args a = { .in = { g->logits_d }, .out = { g->logits32_d } };
		if ((st = kiln_device_run(dev, g->cast, &a, g->stream)))
			return st;
		src = g->logits32_d;
	}
	if ((st = kiln_device_copy_async(dev, g->logits, src, sizeof(float) * (size_t)g->vocab,
					 KILN_COPY_D2H, g->stream)) ||
	    (st = kiln_device_stream_sync(dev, g->stream)))
		return kiln_error_wrap(st, "decoding position %lld", (long long)pos);
	*logits = g->logits;
	return KILN_OK;
}

/* ---- sampling ------------------------------------------------------------ */

/* A candidate of a top-k draw. */
struct cand {
	float logit;
	int32_t id;
};

/* qsort order: larger logit first, then lower id. */
static int by_logit(const void *a, const void *b)
{
	const struct cand *x = a, *y = b;
	if (x->logit != y->logit)
		return x->logit > y->logit ? -1 : 1;
	return (x->id > y->id) - (x->id < y->id);
}

/* The candidates of a draw into c[]: every id below V, or the top_k
 * largest logits (ties: the lower id); returns their count. */
static int64_t candidates(const float *logits, int64_t V, int64_t top_k, struct cand *c)
{
	for (int64_t i = 0; i < V; i++)
		c[i] = (struct cand){ logits[i], (int32_t)i };
	if (top_k <= 0 || top_k >= V)
		return V;
	qsort(c, (size_t)V, sizeof *c, by_logit);
	return top_k;
}

kiln_status kiln_sample_token(const float *logits, int64_t V, const struct kiln_sample_opts *o,
			      uint64_t draw, int32_t *token)
{
	if (o->vocab > 0 && o->vocab < V)
		V = o->vocab;
	if (!(o->temperature > 0) || o->top_k == 1) { /* greedy: the first largest */
		int64_t best = 0;
		for (int64_t i = 1; i < V; i++)
			if (logits[i] > logits[best])
				best = i;
		*token = (int32_t)best;
		return KILN_OK;
	}
	struct cand *c = malloc(sizeof *c * (size_t)V);
	if (!c)
		return kiln_error(KILN_ENOMEM, "out of memory");
	const int64_t n = candidates(logits, V, o->top_k, c);
	float mx = -INFINITY;
	for (int64_t k = 0; k < n; k++)
		mx = c[k].logit > mx ? c[k].logit : mx;
	double total = 0;
	for (int64_t k = 0; k < n; k++)
		total += exp((double)(c[k].logit - mx) / o->temperature);
	/* u in [0, 1) from (seed, the sampling stream, draw): the inverse of
	 * the cumulative distribution, in the candidates' order */
	const double u = (double)kiln_rng_uniform(o->seed, KILN_RNG_SAMPLE, draw, 0) * total;
	double acc = 0;
	*token = c[n - 1].id;
	for (int64_t k = 0; k < n; k++) {
		acc += exp((double)(c[k].logit - mx) / o->temperature);
		if (u < acc) {
			*token = c[k].id;
			break;
		}
	}
	free(c);
	return KILN_OK;
}

kiln_status kiln_generate(struct kiln_generator *g, const int32_t *prompt, int64_t n_prompt,
			  int64_t n_new, const struct kiln_sample_opts *o, int32_t *out,
			  kiln_token_fn fn, void *user)
{
	const float *logits = NULL;
	kiln_status st;
	if (n_prompt < 1)
		return kiln_error(KILN_EINVAL, "the prompt is empty: generation starts from at least one token");
	if (n_prompt + n_new > g->context)
		return kiln_error(KILN_EINVAL, "%lld prompt tokens + %lld new ones exceed the model's context of %lld tokens (ask for at most %lld)",
				  (long long)n_prompt, (long long)n_new, (long long)g->context,
				  (long long)(g->context > n_prompt ? g->context - n_prompt : 0));
	for (int64_t t = 0; t < n_prompt; t++) /* the prompt fills the caches */
		if ((st = kiln_generator_step(g, t, prompt[t], &logits)))
			return st;
	for (int64_t k = 0; k < n_new; k++) {
		int32_t next;
		if ((st = kiln_sample_token(logits, g->vocab, o, (uint64_t)k, &next)))
			return st;
		out[k] = next;
		if (fn && (st = fn(user, next)))
			return st;
		if (k + 1 < n_new && (st = kiln_generator_step(g, n_prompt + k, next, &logits)))
			return st;
	}
	return KILN_OK;
}
