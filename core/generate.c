/* core/generate.c - text generation (`kiln generate`, docs/generate.md):
 * a decode plan of the model (core/plan.c, kiln_plan_opts.decode) at one
 * row, or at N for N samples of one prompt (the prompt fed once, to the
 * one-row plan, whose caches are copied into the N rows), fed one token
 * per row and step, the attention layers' keys and values of the earlier
 * positions kept in the plan's caches, so no step recomputes the prefix;
 * a prompt's positions but its last prefilled, up to PREFILL_MAX a run,
 * by a plan of one row that takes them at once (kiln_model_plan_prefill:
 * the causal forward over them, writing the caches), its caches copied
 * into the one-row plan's, where the device and every layer can (ABI
 * 2.31), else fed a step each;
 * the next token drawn from the logits with temperature, top-k and
 * top-p by the core's counter-based RNG (core/rng.c), sample i on stream
 * i, so a seed gives the same text on any machine and thread count.
 */
#include "graph.h"
#include "run_config.h" /* kiln_run_cfg_read: [run] device */

#include <math.h>
#include <stdio.h>

/* A decode plan of `rows` sequences at once (kiln_plan_opts.decode = the
 * context; each row its own key/value caches) and what a step needs of it. */
struct decoder {
	struct kiln_plan *p;    /* NULL: none yet (or one that failed) */
	int64_t rows;
	int64_t filled;         /* positions 0..filled-1 of the rows' caches hold
				 * the sequences fed since the last position 0 */
	int32_t *io;            /* host i32[rows + 1]: the rows' tokens, the position */
	int32_t *io_d;          /* ... on the device */
	void *logits_d;         /* the plan's logits [rows, 1, V] */
	float *logits32_d;      /* ... widened to f32 (low-precision compute), or NULL */
	void *cast;             /* that CAST, or NULL */
	float *logits;          /* host f32[rows, V] */
};

/* Most positions a prefill run takes: a longer prompt is fed in runs of
 * this many.  The run's memory grows with it (its activations of T rows;
 * since session 45 no [T, V] logits, which it never computes), and past
 * a few hundred rows its GEMMs gain little (docs/generate.md, "Prefill"). */
enum { PREFILL_MAX = 256 };

/* A prompt's prefill: a decode plan of one row whose runs take `chunk`
 * positions at once and write their keys and values into its caches,
 * which are then copied into the one-row plan's; a plan of the caches'
 * state alone (kiln_model_plan_prefill, logits 0: no layer after the
 * last attention is planned, so no [chunk, V] logits).  Held for the
 * next prompt of the same chunk (kiln_generator.prefill_keep, prefill_fits;
 * session 44: making it cost more than feeding a prompt of 64 tokens,
 * docs/generate.md). */
struct prefill {
	struct kiln_plan *p;    /* NULL: none yet (or refused) */
	int refused;            /* the device or a layer cannot: steps feed prompts */
	int said;               /* its want of memory logged (once) */
	int64_t chunk;          /* T, the positions a run */
	int32_t *io;            /* host i32[2 * chunk]: the run's tokens, then positions */
	int32_t *io_d;          /* ... on the device */
};

struct kiln_generator {
	struct kiln_trained t;  /* what kiln_generator_open loaded (t.m NULL: borrowed) */
	struct kiln_model *m;
	void *stream;
	int64_t context, vocab;
	int64_t classes;        /* the ids drawn: below the loss's classes (<= vocab) */
	uint8_t *allowed;       /* host u8[classes], kiln_generator_allow's, or NULL: all */
	double top_p;           /* kiln_generator_top_p's nucleus; 1: every id */
	/* one row: kiln_generate, kiln_generator_step, and the prompt of
	 * kiln_generate_samples (fed once, then copied to its rows); many:
	 * kiln_generate_samples' N > 1 rows, kept until a call of another N
	 * or a one-row call (kiln_generate, kiln_generator_step, N = 1),
	 * which frees it */
	struct decoder one, many;
	struct prefill pre;     /* made for a prompt of 3 tokens or more; kept for the
				 * next prompt of its chunk (prefill_keep, prefill_fits),
				 * remade for another chunk, freed by kiln_generator_close,
				 * before an N-row plan is made, and after every prompt
				 * when !prefill_keep */
	int64_t prefill_max;    /* PREFILL_MAX (tests: kiln_generator_prefill_max) */
	int prefill_keep;       /* 1; 0 under [run] memory_limit (kiln_generator_open):
				 * no second copy of the caches held between prompts */
};

/* Free decode plan d and its buffers (the model stays). */
static void decode_free(struct kiln_generator *g, struct decoder *d)
{
	struct kiln_device *dev = g->m->dev;
	if (g->stream && d->p)
		kiln_device_stream_sync(dev, g->stream);
	kiln_plan_free(d->p);
	if (d->cast)
		kiln_device_plan_free(dev, d->cast);
	kiln_device_free(dev, d->logits32_d);
	kiln_device_free(dev, d->io_d);
	free(d->logits);
	free(d->io);
	memset(d, 0, sizeof *d);
}

/* A decode plan of `rows` > 1 that does not fit the device: KILN_EUSAGE
 * naming the rows, the bytes they need (a sample's too) and why (`why`,
 * then the device's name; free_bytes: its free memory, 0 unknown;
 * cause: the allocation's error, or NULL). */
static kiln_status rows_too_many(const struct kiln_generator *g, int64_t rows, size_t need,
				 const char *why, size_t free_bytes, const char *cause)
{
	const double per = (double)need / (double)rows;
	const double fit = (double)free_bytes / per;
	char room[96] = "";
	if (free_bytes)
		snprintf(room, sizeof room, fit < 1 ? " (%.2f GiB free: not one fits)" : " (%.2f GiB free: about %lld fit)",
			 (double)free_bytes / (1 << 30), (long long)fit);
	return kiln_error(KILN_EUSAGE, "%lld samples decoded at once need a decode plan of %zu bytes (%.2f GiB, %.1f KiB a sample: each its own key/value caches and activations), %s %s device%s: ask for fewer samples%s%s",
			  (long long)rows, need, (double)need / (1 << 30), per / 1024, why,
			  kiln_device_name(g->m->dev), room, cause ? ": " : "", cause ? cause : "");
}

/* The device bytes of a decode plan of `rows` (> 1) into *need: its
 * memory laid out with the device preparing nothing (no primitive is made
 * for a batch that may not fit): the arena, the workspace (where that
 * layout gives one), the logits in f32 on the host (the device's memory
 * on the CPU) and, where the plan's logits are not f32, their f32 copy
 * on the device (decode_plan's logits32_d); rows_too_many when that is
 * more than the device has free (a device that cannot tell: the
 * allocation will).  Before session 42 such a plan failed at its
 * allocation, exit 1, naming "the evaluation plan" alone. */
static kiln_status rows_fit(struct kiln_generator *g, int64_t rows, size_t *need)
{
	struct kiln_plan_opts o = { .decode = g->context, .dry = 1 };
	struct kiln_plan *p = NULL;
	size_t free_bytes, total;
	kiln_device_layout_only(g->m->dev, 1);
	kiln_status st = kiln_model_plan_ex(g->m, rows, &o, &p);
	kiln_device_layout_only(g->m->dev, 0);
	if (!st) {
		const struct kiln_tensor_desc *ld = &p->nodes[p->logits_layer].l.out;
		const size_t f32 = sizeof(float) * (size_t)rows * (size_t)ld->dims[ld->ndim - 1];
		*need = kiln_plan_arena_bytes(p) + kiln_align_up(p->ws_bytes) + f32 +
			(ld->dtype != KILN_F32 ? f32 : 0);
	}
	kiln_plan_free(p);
	if (st)
		return kiln_error_wrap(st, "planning %lld samples decoded at once", (long long)rows);
	if (kiln_device_mem_info(g->m->dev, &free_bytes, &total) || *need <= free_bytes)
		return KILN_OK;
	return rows_too_many(g, rows, *need, "more than the free memory of the", free_bytes, NULL);
}

/* The decode plan d of `rows` sequences, made anew when it had other
 * rows: its caches start empty.  More rows than fit the device are
 * rows_too_many, refused before any allocation where the device tells
 * its free memory. */
static kiln_status decode_plan(struct kiln_generator *g, struct decoder *d, int64_t rows)
{
	struct kiln_device *dev = g->m->dev;
	struct kiln_plan_opts o = { .decode = g->context };
	struct kiln_tensor_desc ld;
	kiln_status st;
	size_t need = 0;
	if (d->p && d->rows == rows)
		return KILN_OK;
	decode_free(g, d);
	if (rows > 1 && (st = rows_fit(g, rows, &need)))
		return st;
	if ((st = kiln_model_plan_ex(g->m, rows, &o, &d->p))) {
		if (rows > 1 && st == KILN_ENOMEM) {
			char cause[1024];
			snprintf(cause, sizeof cause, "%s", kiln_last_error());
			return rows_too_many(g, rows, need, "which could not be allocated on the", 0, cause);
		}
		goto fail;
	}
	if ((st = kiln_plan_logits(d->p, &d->logits_d, &ld)) ||
	    (st = kiln_device_alloc_named(dev, sizeof(int32_t) * (size_t)(rows + 1), (void **)&d->io_d,
					  "the decoder's token ids (one a row, and the step)")))
		goto fail;
	g->vocab = ld.dims[ld.ndim - 1];
	if (ld.dtype != KILN_F32) { /* widen low-precision logits on the device */
		struct kiln_op op;
		memset(&op, 0, sizeof op);
		op.type = KILN_OP_CAST;
		op.n_in = op.n_out = 1;
		op.in[0] = ld;
		op.out[0] = ld;
		op.out[0].dtype = KILN_F32;
		if ((st = kiln_device_prepare(dev, &op, &d->cast, NULL)) ||
		    (st = kiln_device_alloc_named(dev, sizeof(float) * (size_t)(rows * g->vocab),
						  (void **)&d->logits32_d,
						  "the decoder's logits widened to f32 (rows x vocab)")))
			goto fail;
	}
	d->logits = malloc(sizeof(float) * (size_t)(rows * g->vocab));
	d->io = malloc(sizeof(int32_t) * (size_t)(rows + 1));
	if (!d->logits || !d->io) {
		st = kiln_error(KILN_ENOMEM, "out of memory");
		goto fail;
	}
	d->rows = rows;
	return KILN_OK;
fail:
	decode_free(g, d);
	return st;
}

kiln_status kiln_generator_new(struct kiln_model *m, void *stream, int64_t context,
			       struct kiln_generator **out)
{
	if (!m || !stream || !out)
		return kiln_null_arg("kiln_generator_new", !m ? "m" : !stream ? "stream" : "out");
	*out = NULL;
	if (context < 1)
		return kiln_error(KILN_EINVAL, "kiln_generator_new: context = %lld: the most positions a sequence may have, at least 1",
				  (long long)context);
	struct kiln_generator *g = calloc(1, sizeof *g);
	kiln_status st;
	if (!g)
		return kiln_error(KILN_ENOMEM, "out of memory");
	g->m = m;
	g->stream = stream;
	g->context = context;
	g->top_p = 1;
	g->prefill_max = PREFILL_MAX;
	g->prefill_keep = 1;
	if ((st = decode_plan(g, &g->one, 1)))
		goto fail;
	/* the columns past the loss's classes are a padded vocabulary's,
	 * which training never taught (llm.c samples below V, not Vp) */
	g->classes = kiln_model_loss_classes(m);
	if (g->classes <= 0 || g->classes > g->vocab)
		g->classes = g->vocab;
	*out = g;
	return KILN_OK;
fail:
	kiln_generator_close(g);
	return st;
}

/* Whether the model has a [layer.NAME] of type attention, the one layer
 * whose decode plan runs KILN_OP_ATTENTION_DECODE. */
static int model_has_attention(const struct kiln_config *cfg)
{
	const char *sec, *type;
	for (int i = 0; (sec = kiln_config_section(cfg, i)); i++)
		if (!strncmp(sec, "layer.", 6) && (type = kiln_config_get(cfg, sec, "type")) &&
		    !strcmp(type, "attention"))
			return 1;
	return 0;
}

/* The device generation runs on into *name (NULL: [run] device): an
 * attention layer's decode plan needs KILN_OP_ATTENTION_DECODE, which the
 * CUDA device does not implement yet (docs/gpu.md).  For a model with
 * one, a device `auto` chose without it gives way to the CPU device; one
 * [run] device names is refused, before any weight is read.  A model
 * without attention runs on [run] device as it is, and no device is
 * opened here.  A device plugin without has_op implements every op and
 * is not opened here; one with it is opened to ask, then closed
 * (kiln_trained_open opens it again). */
static kiln_status decode_device(const struct kiln_config *cfg, const struct kiln_registry *reg,
				 const char **name)
{
	struct kiln_run_cfg run;
	const struct kiln_plugin *p;
	struct kiln_device *dev;
	kiln_status st;
	*name = NULL;
	if (!model_has_attention(cfg))
		return KILN_OK;
	if ((st = kiln_run_cfg_read(cfg, &run)))
		return st;
	const int is_auto = !strcmp(run.device, "auto");
	/* a device that is not there: kiln_trained_open says so */
	if (is_auto ? kiln_device_auto(reg, &p) : kiln_registry_find(reg, KILN_PLUGIN_DEVICE, run.device, &p))
		return KILN_OK;
	const struct kiln_device_ops *ops = p->ops;
	if (ops->version < 3 || !ops->has_op)
		return KILN_OK;
	if ((st = kiln_device_open(reg, cfg, p->name, 0, &dev)))
		return st;
	const int decodes = kiln_device_has_op(dev, KILN_OP_ATTENTION_DECODE);
	kiln_device_close(dev);
	if (decodes)
		return KILN_OK;
	const struct kiln_plugin *cpu;
	if (!is_auto)
		return kiln_error(KILN_ECONFIG, "%s: generation needs the CPU device: set run.device=cpu (the %s device has no %s, the decoding attention, yet; docs/generate.md)",
				  kiln_config_where(cfg, "run", "device"), p->name,
				  kiln_op_name(KILN_OP_ATTENTION_DECODE));
	if (kiln_registry_find(reg, KILN_PLUGIN_DEVICE, "cpu", &cpu))
		return kiln_error(KILN_ECONFIG, "%s: generation needs the CPU device, which is not here (`kiln plugins`): device = auto chose %s, which has no %s, the decoding attention, yet (docs/generate.md)",
				  kiln_config_where(cfg, "run", "device"), p->name,
				  kiln_op_name(KILN_OP_ATTENTION_DECODE));
	kiln_log(KILN_LOG_INFO, "generate", "device = auto: generating on the CPU device (%s has no %s, the decoding attention, yet)",
		 p->name, kiln_op_name(KILN_OP_ATTENTION_DECODE));
	*name = "cpu";
	return KILN_OK;
}

kiln_status kiln_generator_open(const struct kiln_config *cfg, const struct kiln_registry *reg,
				const char *checkpoint, struct kiln_generator **out)
{
	if (!cfg || !reg || !out)
		return kiln_null_arg("kiln_generator_open", !cfg ? "cfg" : !reg ? "reg" : "out");
	struct kiln_trained t;
	struct kiln_given gv;
	const char *device;
	*out = NULL;
	kiln_status st = decode_device(cfg, reg, &device);
	if (st)
		return st;
	/* kiln_trained_open, on that device */
	if (!(st = kiln_given_open(cfg, reg, checkpoint, &gv))) {
		gv.device = device;
		st = kiln_trained_open_given(cfg, reg, &gv, "generating with", 1, &t);
	}
	kiln_given_close(&gv);
	if (st)
		return st;
	/* [run] precision's compute dtype, as `kiln eval` and `kiln predict`
	 * run it (kiln_infer_prepare; before session 40 generation ran f32
	 * whatever it said); no loss scaler: nothing is trained */
	if ((st = kiln_model_compute_open(t.m, reg))) {
		kiln_trained_close(&t);
		return st;
	}
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
	/* a bound on the device's memory: the prefill plan, a second copy
	 * of the caches, is not held between prompts (as before session 44) */
	struct kiln_run_cfg run;
	if (!kiln_run_cfg_read(cfg, &run) && run.memory_limit_bytes)
		(*out)->prefill_keep = 0;
	return KILN_OK;
}

/* Free the prefill plan and its buffers (what it refused stays known). */
static void prefill_free(struct kiln_generator *g)
{
	struct kiln_device *dev = g->m->dev;
	struct prefill *f = &g->pre;
	if (g->stream && f->p)
		kiln_device_stream_sync(dev, g->stream);
	kiln_plan_free(f->p);
	kiln_device_free(dev, f->io_d);
	free(f->io);
	*f = (struct prefill){ .refused = f->refused, .said = f->said };
}

void kiln_generator_close(struct kiln_generator *g)
{
	if (!g)
		return;
	prefill_free(g);
	decode_free(g, &g->many);
	decode_free(g, &g->one);
	free(g->allowed);
	if (g->t.m)
		kiln_trained_close(&g->t);
	free(g);
}

void kiln_generator_prefill_max(struct kiln_generator *g, int64_t n)
{
	g->prefill_max = n;
}

void kiln_generator_prefill_keep(struct kiln_generator *g, int keep)
{
	g->prefill_keep = keep;
}

int64_t kiln_generator_context(const struct kiln_generator *g) { return g ? g->context : 0; }
int64_t kiln_generator_vocab(const struct kiln_generator *g) { return g ? g->vocab : 0; }
int64_t kiln_generator_classes(const struct kiln_generator *g) { return g ? g->classes : 0; }

kiln_status kiln_generator_allow(struct kiln_generator *g, const uint8_t *allowed, int64_t n)
{
	if (!g)
		return kiln_null_arg("kiln_generator_allow", "g");
	/* the new mask is built aside: an error leaves the old one in place */
	if (!allowed) {
		free(g->allowed);
		g->allowed = NULL;
		return KILN_OK;
	}
	if (n < 0)
		return kiln_error(KILN_EINVAL, "kiln_generator_allow: n = %lld is negative", (long long)n);
	uint8_t *mask = calloc((size_t)g->classes, 1);
	if (!mask)
		return kiln_error(KILN_ENOMEM, "out of memory");
	int64_t any = 0;
	for (int64_t i = 0; i < g->classes && i < n; i++)
		any += mask[i] = allowed[i] != 0;
	if (!any) {
		free(mask);
		return kiln_error(KILN_EINVAL, "kiln_generator_allow: no id below %lld (the model's %lld classes; a mask of %lld entries given) is allowed: nothing could be drawn",
				  (long long)(n < g->classes ? n : g->classes), (long long)g->classes, (long long)n);
	}
	free(g->allowed);
	g->allowed = mask;
	return KILN_OK;
}

/* A nucleus (top-p) bound fn may take: a probability in (0, 1]. */
static kiln_status top_p_check(const char *fn, double top_p)
{
	if (!(top_p > 0 && top_p <= 1))
		return kiln_error(KILN_EINVAL, "%s: top_p = %g: the probability mass to draw from, in (0, 1] (1: every id)",
				  fn, top_p);
	return KILN_OK;
}

kiln_status kiln_generator_top_p(struct kiln_generator *g, double top_p)
{
	if (!g)
		return kiln_null_arg("kiln_generator_top_p", "g");
	kiln_status st = top_p_check("kiln_generator_top_p", top_p);
	if (!st)
		g->top_p = top_p;
	return st;
}

/* Feed tokens[0..rows) at position pos, one to each row of decode plan d,
 * and wait for the rows' logits: *logits, host f32[rows, V].  A position
 * past those the caches hold (d->filled) is refused: its attention would
 * read caches no step wrote (before session 42 it did, silently). */
static kiln_status decode_step(struct kiln_generator *g, struct decoder *d, int64_t pos,
			       const int32_t *tokens, const float **logits)
{
	struct kiln_device *dev = g->m->dev;
	const int64_t rows = d->rows;
	kiln_status st;
	if (pos < 0 || pos >= g->context)
		return kiln_error(KILN_EINVAL, "position %lld outside the model's context of %lld tokens",
				  (long long)pos, (long long)g->context);
	if (pos > d->filled)
		return d->filled ? kiln_error(KILN_EINVAL, "position %lld, but the caches hold positions 0..%lld of the sequence only: feed position %lld first (or 0, to start a new sequence)",
					      (long long)pos, (long long)(d->filled - 1), (long long)d->filled)
				 : kiln_error(KILN_EINVAL, "position %lld of no sequence: the caches hold no position (a new generator, or a step at position 0 that failed): feed position 0 first",
					      (long long)pos);
	for (int64_t r = 0; r < rows; r++) {
		if (tokens[r] < 0)
			return kiln_error(KILN_EINVAL, "token id %d at position %lld is negative", tokens[r],
					  (long long)pos);
		d->io[r] = tokens[r];
	}
	d->io[rows] = (int32_t)pos;
	d->filled = pos; /* 0..pos-1 stay; pos counts once the step ran */
	if ((st = kiln_device_copy_async(dev, d->io_d, d->io, sizeof(int32_t) * (size_t)(rows + 1),
					 KILN_COPY_H2D, g->stream)) ||
	    (st = kiln_plan_decode(d->p, d->io_d, d->io_d + rows, g->stream)))
		return kiln_error_wrap(st, "decoding position %lld", (long long)pos);
	const void *src = d->logits_d;
	if (d->cast) {
		struct kiln_op_args a = { .in = { d->logits_d }, .out = { d->logits32_d } };
		if ((st = kiln_device_run(dev, d->cast, &a, g->stream)))
			return st;
		src = d->logits32_d;
	}
	if ((st = kiln_device_copy_async(dev, d->logits, src, sizeof(float) * (size_t)(rows * g->vocab),
					 KILN_COPY_D2H, g->stream)) ||
	    (st = kiln_device_stream_sync(dev, g->stream)))
		return kiln_error_wrap(st, "decoding position %lld", (long long)pos);
	d->filled = pos + 1;
	*logits = d->logits;
	return KILN_OK;
}

kiln_status kiln_generator_step(struct kiln_generator *g, int64_t pos, int32_t token,
				const float **logits)
{
	if (!g || !logits)
		return kiln_null_arg("kiln_generator_step", !g ? "g" : "logits");
	decode_free(g, &g->many); /* a one-row call: kiln_generate_samples' N rows go */
	kiln_status st = decode_plan(g, &g->one, 1);
	return st ? st : decode_step(g, &g->one, pos, &token, logits);
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

/* Every logit that may be drawn (allowed[i], NULL: every one below V) is
 * a number or -inf (a probability of 0), and one is more than -inf: a NaN
 * or +inf (a model whose output overflowed, or whose weights are not
 * finite) has no distribution to draw from, as torch.multinomial refuses
 * it; before session 40 the draw then gave id V - 1, silently. */
static kiln_status logits_check(const float *logits, int64_t V, const uint8_t *allowed)
{
	int64_t live = 0;
	for (int64_t i = 0; i < V; i++) {
		if (allowed && !allowed[i])
			continue;
		if (isnan(logits[i]) || logits[i] == INFINITY)
			return kiln_error(KILN_EDATA, "the logit of id %lld is %s: no token can be drawn from logits that are not finite (the model's output overflowed, or its weights are not finite)",
					  (long long)i, isnan(logits[i]) ? "NaN" : "+inf");
		live += logits[i] > -INFINITY;
	}
	if (!live)
		return kiln_error(KILN_EDATA, "every logit that may be drawn is -inf: no token has a probability");
	return KILN_OK;
}

/* The candidates of a draw into c[]: every id below V that allowed lets
 * through (NULL: all), or the top_k largest logits of those (ties: the
 * lower id); returns their count. */
static int64_t candidates(const float *logits, int64_t V, const uint8_t *allowed, int64_t top_k,
			  struct cand *c)
{
	int64_t n = 0;
	for (int64_t i = 0; i < V; i++)
		if (!allowed || allowed[i])
			c[n++] = (struct cand){ logits[i], (int32_t)i };
	if (top_k <= 0 || top_k >= n)
		return n;
	qsort(c, (size_t)n, sizeof *c, by_logit);
	return top_k;
}

/* A candidate's weight, its probability times the candidates' total:
 * exp((logit - max) / temperature) (the difference in f32, as it always
 * was: the draws of a seed stay the same). */
static double weight(const struct cand *c, float mx, double temperature)
{
	return exp((double)(c->logit - mx) / temperature);
}

/* Whether candidate a comes before b in by_logit's order. */
static int before(const struct cand *a, const struct cand *b)
{
	return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

static void cand_swap(struct cand *c, int64_t i, int64_t j)
{
	const struct cand t = c[i];
	c[i] = c[j];
	c[j] = t;
}

/* Move the first k of c[0..n) in by_logit's order (a strict order: the
 * ids differ) into c[0..k), in no order (quickselect, the pivot the
 * median of three: O(n) on average); 0 < k <= n. */
static void select_first(struct cand *c, int64_t n, int64_t k)
{
	int64_t lo = 0, hi = n; /* c[k - 1]'s place lies in c[lo..hi) */
	while (hi - lo > 1) {
		const int64_t mid = lo + (hi - lo) / 2;
		if (before(&c[mid], &c[lo]))
			cand_swap(c, mid, lo);
		if (before(&c[hi - 1], &c[lo]))
			cand_swap(c, hi - 1, lo);
		if (before(&c[mid], &c[hi - 1]))
			cand_swap(c, mid, hi - 1); /* the median of the three at hi - 1 */
		const struct cand p = c[hi - 1];
		int64_t s = lo;
		for (int64_t i = lo; i < hi - 1; i++)
			if (before(&c[i], &p))
				cand_swap(c, i, s++);
		cand_swap(c, s, hi - 1); /* c[lo..s) before p, c(s..hi) after */
		if (s == k - 1)
			return;
		if (s > k - 1)
			hi = s;
		else
			lo = s + 1;
	}
}

/* The nucleus of candidates c[0..n) (top-p, as HuggingFace's
 * TopPLogitsWarper): the smallest leading set, in by_logit's order
 * (larger first, ties the lower id: top-k's order), whose probabilities
 * sum to top_p or more of the candidates' whole, moved to c's front in
 * that order; returns its size, at least 1.  Only the leading m are
 * sorted: selected from the rest, m = 64 first and doubled until their
 * sum reaches top_p (GPT-2's 50,257 logits: docs/generate.md).  The
 * whole's sum is added in c's order (a full sort added it largest first:
 * the last bits may differ, which moves the cut only where a prefix's
 * sum lies that close to top_p times the whole). */
static int64_t nucleus(struct cand *c, int64_t n, float mx, double temperature, double top_p)
{
	double total = 0, acc = 0;
	for (int64_t k = 0; k < n; k++)
		total += weight(&c[k], mx, temperature);
	int64_t k = 0; /* c[0..k) sorted, the first k, their sum acc */
	for (int64_t m = 64; k < n; m *= 2) {
		const int64_t end = m < n ? m : n;
		if (end < n)
			select_first(c + k, n - k, end - k);
		qsort(c + k, (size_t)(end - k), sizeof *c, by_logit);
		for (; k < end; k++) {
			acc += weight(&c[k], mx, temperature);
			if (acc >= top_p * total)
				return k + 1;
		}
	}
	return n; /* (not reached: acc ends near total, and top_p < 1) */
}

/* The ids a draw chooses among: c[0..n) (malloc'd, the caller frees),
 * the first largest c[best] (greedy's choice); the ids below V (below
 * o->vocab when less) that allowed lets through (NULL: all), the top_k
 * largest of those (ties: the lower id), and of those the nucleus of
 * top_p (1: all).  Greedy (temperature 0 or top_k 1): every candidate,
 * c[best] the one drawn. */
struct draw_set {
	struct cand *c;
	int64_t n, best;
	int greedy;
};

static kiln_status draw_set(const float *logits, int64_t V, const uint8_t *allowed,
			    const struct kiln_sample_opts *o, double top_p, struct draw_set *s)
{
	if (o->vocab > 0 && o->vocab < V)
		V = o->vocab;
	kiln_status st = logits_check(logits, V, allowed);
	if (st)
		return st;
	if (!(s->c = malloc(sizeof *s->c * (size_t)V)))
		return kiln_error(KILN_ENOMEM, "out of memory");
	s->greedy = !(o->temperature > 0) || o->top_k == 1;
	s->n = candidates(logits, V, allowed, s->greedy ? 0 : o->top_k, s->c);
	s->best = 0; /* the first largest (in id order, or top-k order) */
	for (int64_t k = 1; k < s->n; k++)
		if (s->c[k].logit > s->c[s->best].logit)
			s->best = k;
	if (!s->greedy && top_p < 1) {
		s->n = nucleus(s->c, s->n, s->c[s->best].logit, o->temperature, top_p);
		s->best = 0;
	}
	return KILN_OK;
}

/* The sum of the weights of s's candidates (not greedy). */
static double draw_total(const struct draw_set *s, double temperature)
{
	const float mx = s->c[s->best].logit;
	double total = 0;
	for (int64_t k = 0; k < s->n; k++)
		total += weight(&s->c[k], mx, temperature);
	return total;
}

/* kiln_sample_token_ex among the ids allowed (NULL: all below V). */
static kiln_status sample(const float *logits, int64_t V, const uint8_t *allowed,
			  const struct kiln_sample_opts *o, double top_p, uint64_t draw,
			  uint32_t stream, int32_t *token)
{
	struct draw_set s;
	kiln_status st = draw_set(logits, V, allowed, o, top_p, &s);
	if (st)
		return st;
	const struct cand *c = s.c;
	const float mx = c[s.best].logit;
	*token = c[s.best].id;
	if (s.greedy) {
		free(s.c);
		return KILN_OK;
	}
	const double total = draw_total(&s, o->temperature);
	/* u in [0, 1) from (seed, the sampling stream, draw, the sample's
	 * stream): the inverse of the cumulative distribution, in the
	 * candidates' order; where rounding leaves u past the last sum, the
	 * last candidate with a probability */
	const double u = (double)kiln_rng_uniform(o->seed, KILN_RNG_SAMPLE, draw, stream) * total;
	double acc = 0;
	for (int64_t k = 0; k < s.n; k++) {
		const double w = weight(&c[k], mx, o->temperature);
		acc += w;
		if (w > 0)
			*token = c[k].id;
		if (u < acc)
			break;
	}
	free(s.c);
	return KILN_OK;
}

/* The NULL and top_p checks of the sampling call fn, whose result goes
 * to the argument out_name. */
static kiln_status sample_args(const char *fn, const float *logits, const struct kiln_sample_opts *o,
			       double top_p, const void *out, const char *out_name)
{
	if (!logits || !o || !out)
		return kiln_null_arg(fn, !logits ? "logits" : !o ? "o" : out_name);
	return top_p_check(fn, top_p);
}

kiln_status kiln_sample_token(const float *logits, int64_t V, const struct kiln_sample_opts *o,
			      uint64_t draw, int32_t *token)
{
	kiln_status st = sample_args("kiln_sample_token", logits, o, 1, token, "token");
	return st ? st : sample(logits, V, NULL, o, 1, draw, 0, token);
}

kiln_status kiln_sample_token_ex(const float *logits, int64_t V, const struct kiln_sample_opts *o,
				 double top_p, uint64_t draw, uint32_t sample_stream, int32_t *token)
{
	kiln_status st = sample_args("kiln_sample_token_ex", logits, o, top_p, token, "token");
	return st ? st : sample(logits, V, NULL, o, top_p, draw, sample_stream, token);
}

kiln_status kiln_sample_probs(const float *logits, int64_t V, const struct kiln_sample_opts *o,
			      double top_p, double *probs)
{
	struct draw_set s;
	kiln_status st = sample_args("kiln_sample_probs", logits, o, top_p, probs, "probs");
	if (st || (st = draw_set(logits, V, NULL, o, top_p, &s)))
		return st;
	for (int64_t i = 0; i < V; i++)
		probs[i] = 0;
	if (s.greedy) {
		probs[s.c[s.best].id] = 1;
	} else {
		const double total = draw_total(&s, o->temperature);
		for (int64_t k = 0; k < s.n; k++)
			probs[s.c[k].id] = weight(&s.c[k], s.c[s.best].logit, o->temperature) / total;
	}
	free(s.c);
	return KILN_OK;
}

/* Whether the held prefill plan of `held` positions a run takes a prompt
 * whose own run length is `chunk`: one of as many.  A shorter prompt
 * could run in it padded (prefill_feed pads a short run), but its
 * padding's positions are computed: measured in session 45 (commit
 * 781e665b, which took a prompt of half the held run; docs/generate.md
 * "Prefill"), the held plan of twice the run beat making the prompt's own only on
 * the char GPT (width 128) up to runs of 32; at 64 there, and on a model
 * of GPT-2's width (768), whose positions cost far more than making a
 * plan, it lost.  So no padded reuse. */
static int prefill_fits(int64_t held, int64_t chunk)
{
	return chunk == held;
}

/* The prefill plan for a prompt of m >= 2 positions before its last:
 * chunk = the least power of two >= m, at most PREFILL_MAX and the
 * context; the plan held (g->prefill_keep) when of that chunk
 * (prefill_fits), else made anew (one_feed frees it after the prompt
 * where it is not to be held; the bytes it holds are logged at debug
 * level).  *ok = 0
 * where the prompt is to be fed a step a position, as before session 43:
 * the plan could not be made (KILN_ENOTSUP: a device that refuses
 * ATTENTION_DECODE_RUN, one built before ABI 2.31 or rebuilt unchanged;
 * a layer that keeps state or is not built in and did not set
 * kiln_layer.decode_runs), or its caches are not laid out by row
 * (kiln_layer.decode_caches) or a position apiece (decode_pos_bytes),
 * each said once at info level and never tried again; or its memory
 * could not be allocated (KILN_ENOMEM: said once, tried again at the
 * next prompt). */
static kiln_status prefill_plan(struct kiln_generator *g, int64_t m, int *ok)
{
	struct prefill *f = &g->pre;
	int64_t chunk = 2;
	while (chunk < m && chunk * 2 <= g->prefill_max)
		chunk *= 2;
	if (chunk > g->context)
		chunk = g->context;
	*ok = !f->refused && f->p && prefill_fits(f->chunk, chunk);
	if (*ok || f->refused)
		return KILN_OK;
	prefill_free(g);
	kiln_status st = kiln_model_plan_prefill(g->m, g->context, chunk, 0, &f->p);
	const int by_row = !st && kiln_plan_decode_rows_copyable(f->p);
	const int by_pos = by_row && kiln_plan_decode_by_position(f->p);
	if (st || !by_pos) {
		if (st != KILN_ENOMEM || !f->said)
			kiln_log(KILN_LOG_INFO, "generate", "the prompt is fed a position a step, not prefilled: %s",
				 st ? kiln_last_error()
				 : !by_row ? "a layer does not lay its decoding caches out by row (kiln_layer.decode_caches, ABI 2.26)"
					   : "a layer keeps a running state, not a position apiece (kiln_layer.decode_pos_bytes 0): a prefill's padded and repeated positions would enter it");
		f->refused = st != KILN_ENOMEM;
		f->said |= st == KILN_ENOMEM;
		prefill_free(g);
		return KILN_OK;
	}
	if (kiln_device_alloc(g->m->dev, sizeof(int32_t) * (size_t)(2 * chunk), (void **)&f->io_d) ||
	    !(f->io = malloc(sizeof(int32_t) * (size_t)(2 * chunk)))) {
		if (!f->said) /* as the plan's memory: steps, this prompt */
			kiln_log(KILN_LOG_INFO, "generate", "the prompt is fed a position a step, not prefilled: no memory for the prefill's %lld tokens",
				 (long long)chunk);
		f->said = 1;
		prefill_free(g);
		return KILN_OK;
	}
	f->chunk = chunk;
	*ok = 1;
	kiln_log(KILN_LOG_DEBUG, "generate", "prefill plan of %lld positions a run made: %zu bytes (%s)",
		 (long long)chunk, kiln_plan_arena_bytes(f->p) + kiln_align_up(f->p->ws_bytes),
		 g->prefill_keep ? "held for the next prompt of as many" : "freed after the prompt");
	return KILN_OK;
}

/* Feed prompt[0..m) to the prefill plan in runs of its chunk positions
 * (the last run of a longer prompt ends at m, overlapping the one before:
 * its positions are computed again and rewritten; the run of a shorter
 * one is padded with id 0 at positions m.., which are never copied),
 * then copy positions 0..m-1 of its caches into the one-row plan's,
 * which holds them then (g->one.filled = m; 0 on an error). */
static kiln_status prefill_feed(struct kiln_generator *g, const int32_t *prompt, int64_t m)
{
	struct prefill *f = &g->pre;
	struct kiln_device *dev = g->m->dev;
	const int64_t T = f->chunk;
	kiln_status st;
	size_t bytes;
	g->one.filled = 0; /* its caches are written anew */
	for (int64_t t = 0; t < m; t++)
		if (prompt[t] < 0)
			return kiln_error(KILN_EINVAL, "token id %d at position %lld is negative", prompt[t],
					  (long long)t);
	for (int64_t s = 0; s < m; s += T) {
		const int64_t at = s + T > m && m > T ? m - T : s;
		for (int64_t i = 0; i < T; i++) {
			f->io[i] = at + i < m ? prompt[at + i] : 0;
			f->io[T + i] = (int32_t)(at + i);
		}
		/* (synchronised: f->io is written again by the next run) */
		if ((st = kiln_device_copy_async(dev, f->io_d, f->io, sizeof(int32_t) * (size_t)(2 * T),
						 KILN_COPY_H2D, g->stream)) ||
		    (st = kiln_plan_decode_state(f->p, f->io_d, f->io_d + T, g->stream)) ||
		    (st = kiln_device_stream_sync(dev, g->stream)))
			return kiln_error_wrap(st, "prefilling positions %lld..%lld of the prompt", (long long)at,
					       (long long)((at + T < m ? at + T : m) - 1));
	}
	if ((st = kiln_plan_decode_copy_rows(g->one.p, f->p, m, g->stream, &bytes)))
		return st;
	g->one.filled = m;
	return KILN_OK;
}

/* Feed prompt[0..m) to the one-row plan from position 0: prefilled
 * (m >= 2, where prefill_plan says it can), else a step a position (its
 * logits into *logits), as before session 43. */
static kiln_status one_feed(struct kiln_generator *g, const int32_t *prompt, int64_t m,
			    const float **logits)
{
	int ok = 0;
	kiln_status st = m > 1 && g->prefill_max > 1 ? prefill_plan(g, m, &ok) : KILN_OK;
	if (st || ok) {
		st = st ? st : prefill_feed(g, prompt, m);
		if (st || !g->prefill_keep)
			prefill_free(g); /* its caches and activations go now */
		return st;
	}
	for (int64_t t = 0; t < m; t++)
		if ((st = decode_step(g, &g->one, t, &prompt[t], logits)))
			return st;
	return KILN_OK;
}

/* Feed prompt[0..n_prompt) to every row of decode plan d, leaving the
 * logits after its last token in *logits.  Its first n_prompt - 1 tokens
 * go to the one-row plan (one_feed: prefilled where it can be, so the
 * prompt costs a few runs and one copy of logits to the host, not a step
 * and a copy a token), whose caches' positions 0..n_prompt-2 are, with
 * several rows, then copied into every row of d (logged at debug level
 * with the bytes); then the last token to every row (its logits d's own,
 * as before).  A model with a layer whose caches are not laid out by row
 * (kiln_layer.decode_caches) is fed the whole prompt in every row, a
 * step a position (before session 42, every model: N rows of compute a
 * prompt token). */
static kiln_status prompt_feed(struct kiln_generator *g, struct decoder *d, const int32_t *prompt,
			       int64_t n_prompt, int32_t *col, const float **logits)
{
	kiln_status st = KILN_OK;
	int64_t t = 0;
	if (n_prompt > 1 && g->one.p && kiln_plan_decode_rows_copyable(g->one.p) &&
	    (d == &g->one || kiln_plan_decode_rows_copyable(d->p))) {
		t = n_prompt - 1;
		if ((st = one_feed(g, prompt, t, logits)))
			return st;
		if (d != &g->one) {
			size_t bytes;
			if ((st = kiln_plan_decode_copy_rows(d->p, g->one.p, t, g->stream, &bytes)))
				return st;
			d->filled = t;
			kiln_log(KILN_LOG_DEBUG, "generate", "prompt fed once: its %lld positions copied into %lld rows (%zu bytes)",
				 (long long)t, (long long)d->rows, bytes);
		}
	}
	for (; t < n_prompt && !st; t++) {
		for (int64_t r = 0; r < d->rows; r++)
			col[r] = prompt[t];
		st = decode_step(g, d, t, col, logits);
	}
	return st;
}

/* The decode plan of `rows`: the one-row plan (a one-row call:
 * kiln_generate_samples' N rows go), or that of N > 1 rows. */
static kiln_status rows_plan(struct kiln_generator *g, int64_t rows)
{
	if (rows == 1)
		decode_free(g, &g->many);
	else if (!g->many.p || g->many.rows != rows)
		prefill_free(g); /* its memory, for the N rows' (rows_fit) */
	return decode_plan(g, rows == 1 ? &g->one : &g->many, rows);
}

/* kiln_generate_samples' work: kiln_generate is its one row. */
static kiln_status generate_rows(struct kiln_generator *g, const int32_t *prompt, int64_t n_prompt,
				 int64_t n_new, int64_t rows, const struct kiln_sample_opts *o,
				 int32_t *out, kiln_samples_fn fn, void *user)
{
	struct decoder *d = rows == 1 ? &g->one : &g->many;
	const float *logits = NULL;
	int32_t *col; /* the token each row is fed */
	kiln_status st;
	if (n_prompt < 1)
		return kiln_error(KILN_EINVAL, "the prompt is empty: generation starts from at least one token");
	if (n_prompt + n_new > g->context)
		return kiln_error(KILN_EINVAL, "%lld prompt tokens + %lld new ones exceed the model's context of %lld tokens (ask for at most %lld)",
				  (long long)n_prompt, (long long)n_new, (long long)g->context,
				  (long long)(g->context > n_prompt ? g->context - n_prompt : 0));
	/* ids past the classes: embedding rows training never taught (a
	 * padded vocabulary's), as never drawn (before session 41 fed) */
	for (int64_t t = 0; t < n_prompt; t++)
		if (prompt[t] >= g->classes)
			return kiln_error(KILN_EINVAL, "prompt token %lld is id %d, not below the model's %lld classes (the loss layer's: no training taught it)",
					  (long long)t, prompt[t], (long long)g->classes);
	if ((st = rows_plan(g, rows)))
		return st;
	if (!(col = malloc(sizeof *col * (size_t)rows)))
		return kiln_error(KILN_ENOMEM, "out of memory");
	st = prompt_feed(g, d, prompt, n_prompt, col, &logits);
	for (int64_t k = 0; k < n_new && !st; k++) {
		for (int64_t r = 0; r < rows && !st; r++) {
			if ((st = sample(logits + r * g->vocab, g->classes, g->allowed, o, g->top_p,
					 (uint64_t)k, (uint32_t)r, &col[r]))) {
				st = rows == 1 ? kiln_error_wrap(st, "drawing new token %lld (position %lld)", (long long)k,
								 (long long)(n_prompt + k))
					       : kiln_error_wrap(st, "drawing new token %lld (position %lld) of sample %lld",
								 (long long)k, (long long)(n_prompt + k), (long long)r);
				break;
			}
			out[r * n_new + k] = col[r];
			if (fn)
				st = fn(user, r, col[r]);
		}
		if (!st && k + 1 < n_new)
			st = decode_step(g, d, n_prompt + k, col, &logits);
	}
	free(col);
	return st;
}

kiln_status kiln_generate_samples(struct kiln_generator *g, const int32_t *prompt, int64_t n_prompt,
				  int64_t n_new, int64_t n_samples, const struct kiln_sample_opts *o,
				  int32_t *out, kiln_samples_fn fn, void *user)
{
	if (!g || !prompt || !o || !out)
		return kiln_null_arg("kiln_generate_samples", !g ? "g" : !prompt ? "prompt" : !o ? "o" : "out");
	if (n_samples < 1 || n_samples > INT32_MAX)
		return kiln_error(KILN_EINVAL, "kiln_generate_samples: n_samples = %lld: 1 to %d continuations",
				  (long long)n_samples, INT32_MAX);
	return generate_rows(g, prompt, n_prompt, n_new, n_samples, o, out, fn, user);
}

kiln_status kiln_generator_plan_samples(struct kiln_generator *g, int64_t n_samples)
{
	if (!g)
		return kiln_null_arg("kiln_generator_plan_samples", "g");
	if (n_samples < 1 || n_samples > INT32_MAX)
		return kiln_error(KILN_EINVAL, "kiln_generator_plan_samples: n_samples = %lld: 1 to %d continuations",
				  (long long)n_samples, INT32_MAX);
	return rows_plan(g, n_samples);
}

/* kiln_generate's callback, called for its one row. */
struct one_row {
	kiln_token_fn fn;
	void *user;
};

static kiln_status one_row_token(void *user, int64_t row, int32_t token)
{
	const struct one_row *f = user;
	(void)row;
	return f->fn(f->user, token);
}

kiln_status kiln_generate(struct kiln_generator *g, const int32_t *prompt, int64_t n_prompt,
			  int64_t n_new, const struct kiln_sample_opts *o, int32_t *out,
			  kiln_token_fn fn, void *user)
{
	if (!g || !prompt || !o || !out)
		return kiln_null_arg("kiln_generate", !g ? "g" : !prompt ? "prompt" : !o ? "o" : "out");
	struct one_row f = { fn, user };
	return generate_rows(g, prompt, n_prompt, n_new, 1, o, out, fn ? one_row_token : NULL, &f);
}
