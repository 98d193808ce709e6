/* core/infer_passes.c - inference graph passes: batchnorm folded into the
 * conv or linear before it, dropout removed, bias + activation left to the
 * layer's epilogue ([run] fuse), the device's layout ([model] layout =
 * auto: nhwc on the CPU) unless a layer refuses it (then the trained
 * one's).  The math and the rules are in
 * infer_passes.h; docs/inference.md ("Folding") is the user's view. */
#include "infer_passes.h"
#include "config_impl.h"

#include <math.h>
#include <stdio.h>

/* ---- which layers fold ------------------------------------------------ */

static int is_type(const struct kiln_model *m, int i, const char *type)
{
	return i >= 0 && !strcmp(m->layers[i].type->name, type);
}

/* Does another layer share layer i's weight ([layer.X] tie = i)?  A
 * batchnorm folded into i would scale the weight that X reads too. */
static int tied_to(const struct kiln_model *m, int i)
{
	for (int k = 0; k < m->n_layers; k++)
		if (k != i && m->layers[k].tie == i)
			return k;
	return -1;
}

/* May batchnorm j fold into its input i (a conv or linear it alone
 * reads)?  Not into a layer whose weight is shared, either way: the
 * tie's other side would read the folded weight (before session 34 a
 * tie owner took the fold, and its users read the scaled weight).  say:
 * log why not (once: the config's plan, not the weights' replay of it). */
static int may_fold(const struct kiln_model *m, int i, int j, int say)
{
	if (kiln_model_only_consumer(m, i) != j)
		return 0;
	const int k = m->layers[i].tie >= 0 ? m->layers[i].tie : tied_to(m, i);
	if (k >= 0) {
		if (say)
			kiln_log(KILN_LOG_INFO, "infer", "batchnorm '%s' not folded into '%s': its weight is shared with '%s' (tie)",
				 m->layers[j].name, m->layers[i].name, m->layers[k].name);
		return 0;
	}
	return 1;
}

/* removed[j]: layer j disappears (a dropout, or a batchnorm folded into
 * its input); host[i]: the batchnorm folded into layer i, else -1.
 * Both n_layers long, the caller's. */
static int fold_plan(const struct kiln_model *m, int *removed, int *host, int say)
{
	int n = 0;
	for (int j = 0; j < m->n_layers; j++) {
		const int i = m->layers[j].in[0];
		host[j] = -1;
		removed[j] = 0;
		if (m->layers[j].n_in != 1)
			continue;
		if (is_type(m, j, "dropout")) {
			removed[j] = 1;
		} else if (is_type(m, j, "batchnorm") && (is_type(m, i, "conv") || is_type(m, i, "linear")) &&
			   may_fold(m, i, j, say)) {
			removed[j] = 1;
			host[i] = j;
		}
		n += removed[j];
	}
	return n;
}

/* The layer whose output stands for layer k's once the removed layers are
 * gone (-1: the data): a removed layer's first input, or the conv that
 * took a removed add (into[k] >= 0; into may be NULL: none). */
static int resolve(const struct kiln_model *m, const int *removed, const int *into, int k)
{
	while (k >= 0 && removed[k])
		k = into && into[k] >= 0 ? into[k] : m->layers[k].in[0];
	return k;
}

/* ---- the residual add in the conv's epilogue (KILN_FOLD_RESIDUAL) ------- */

/* Does layer c's output reach layer j only through removed layers, each
 * (and c) read by the next alone? */
static int feeds_only(const struct kiln_model *m, const int *removed, int c, int j)
{
	for (int k = c; k != j;) {
		const int n = kiln_model_only_consumer(m, k);
		if (n < 0 || (n != j && !removed[n]))
			return 0;
		k = n;
	}
	return 1;
}

/* A two-input add whose later input (after the folds) is a one-input conv
 * that feeds only it: the add goes (removed, into[add] = conv) and the
 * conv takes the other input as its residual (resid[conv], a layer index
 * of m, -1 the data; -2 none), the sum before the conv's fused
 * activation, so the ReLU that reads the add becomes the conv's epilogue.
 * The other input comes earlier, so the conv still runs after it.
 * Returns the adds removed. */
static int residual_plan(const struct kiln_model *m, int *removed, int *into, int *resid)
{
	int n = 0;
	for (int j = 0; j < m->n_layers; j++)
		into[j] = -1, resid[j] = -2;
	for (int j = 0; j < m->n_layers; j++) {
		const struct model_layer *L = &m->layers[j];
		double u8 = 0; /* an INT8 add's u8 output stays the add's */
		kiln_config_get_float(m->cfg, L->section, "int8_out_scale", &u8);
		if (!is_type(m, j, "add") || L->n_in != 2 || u8 > 0)
			continue;
		const int a = resolve(m, removed, into, L->in[0]), b = resolve(m, removed, into, L->in[1]);
		const int c = a > b ? a : b, other = a > b ? L->in[1] : L->in[0];
		if (a == b || !is_type(m, c, "conv") || m->layers[c].n_in != 1 || m->layers[c].tie >= 0 ||
		    resid[c] != -2 || !feeds_only(m, removed, c, j))
			continue;
		removed[j] = 1;
		into[j] = c;
		resid[c] = other;
		n++;
	}
	return n;
}

/* ---- the folded config ------------------------------------------------ */

static int layer_index(const struct kiln_model *m, const char *section)
{
	for (int i = 0; i < m->n_layers; i++)
		if (!strcmp(m->layers[i].section, section))
			return i;
	return -1;
}

/* The INI text of layer i's section: its own keys but input(s) and (for a
 * layer that takes a batchnorm) bias, then its inputs by name. */
static void write_layer(FILE *f, const struct kiln_model *m, const struct section *s, int i,
			const int *removed, const int *host, const int *into, const int *resid)
{
	const struct model_layer *L = &m->layers[i];
	fprintf(f, "[%s]\n", s->name);
	for (int e = 0; e < s->n; e++) {
		const char *k = s->e[e].key;
		if (!strcmp(k, "input") || !strcmp(k, "inputs") || (host[i] >= 0 && !strcmp(k, "bias")))
			continue;
		fprintf(f, "%s = %s\n", k, s->e[e].value);
	}
	if (host[i] >= 0)
		fprintf(f, "bias = 1\n");
	fprintf(f, "inputs = ");
	for (int k = 0; k <= L->n_in; k++) {
		if (k == L->n_in && resid[i] == -2)
			break;
		int p = resolve(m, removed, into, k < L->n_in ? L->in[k] : resid[i]);
		fprintf(f, "%s%s", k ? ", " : "", p < 0 ? "data" : m->layers[p].name);
	}
	fprintf(f, "\n\n");
}

/* The keys the inference graph sets whatever the model trained with:
 * the epilogue fusion, and the layout (value NULL: write_folded's
 * `layout`, chosen by fold_layout: the device's own, `auto`, nhwc on the
 * CPU, whose oneDNN convolutions run channels-last without the reorders
 * around every nchw one; the weights are the same in either layout). */
static const struct {
	const char *section, *key, *value;
} infer_keys[] = { { "run", "fuse", "1" }, { "model", "layout", NULL } };
#define N_INFER_KEYS (int)(sizeof infer_keys / sizeof infer_keys[0])

static int infer_key(const char *section, const char *key)
{
	for (int k = 0; k < N_INFER_KEYS; k++)
		if (!strcmp(section, infer_keys[k].section) && !strcmp(key, infer_keys[k].key))
			return 1;
	return 0;
}

/* The whole folded config as INI text into f. */
static void write_folded(FILE *f, const struct kiln_model *m, const char *layout,
			 const int *removed, const int *host, const int *into, const int *resid)
{
	const struct kiln_config *cfg = m->cfg;
	for (int si = 0; si < cfg->n; si++) {
		const struct section *s = &cfg->s[si];
		const int i = layer_index(m, s->name);
		if (i >= 0) {
			if (!removed[i])
				write_layer(f, m, s, i, removed, host, into, resid);
			continue;
		}
		fprintf(f, "[%s]\n", s->name);
		for (int e = 0; e < s->n; e++)
			if (!infer_key(s->name, s->e[e].key))
				fprintf(f, "%s = %s\n", s->e[e].key, s->e[e].value);
		for (int k = 0; k < N_INFER_KEYS; k++)
			if (!strcmp(s->name, infer_keys[k].section))
				fprintf(f, "%s = %s\n", infer_keys[k].key,
					infer_keys[k].value ? infer_keys[k].value : layout);
		fprintf(f, "\n");
	}
	for (int k = 0; k < N_INFER_KEYS; k++)
		if (!kiln_cfg_find_section(cfg, infer_keys[k].section))
			fprintf(f, "[%s]\n%s = %s\n\n", infer_keys[k].section, infer_keys[k].key,
				infer_keys[k].value ? infer_keys[k].value : layout);
}

kiln_status kiln_infer_fold_config(const struct kiln_model *m, struct kiln_registry *reg,
				   struct kiln_config **out, int *n_folded)
{
	return kiln_infer_fold_config_ex(m, reg, 0, out, n_folded);
}

/* The folded config of m with [model] layout = `layout` (the plan in
 * removed, host, into, resid), loaded and validated against reg into
 * *out (new; NULL on failure). */
static kiln_status fold_load(const struct kiln_model *m, struct kiln_registry *reg,
			     const char *layout, const int *removed, const int *host,
			     const int *into, const int *resid, struct kiln_config **out)
{
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);
	kiln_status st;
	*out = NULL;
	if (!f)
		return kiln_error(KILN_ENOMEM, "out of memory");
	write_folded(f, m, layout, removed, host, into, resid);
	if (fclose(f)) {
		free(text);
		return kiln_error(KILN_ENOMEM, "out of memory");
	}
	if ((st = kiln_config_load_string(text, m->cfg->file ? m->cfg->file : "folded", out)) ||
	    (st = kiln_config_validate(*out, reg))) {
		st = kiln_error_wrap(st, "the folded config");
		kiln_config_free(*out);
		*out = NULL;
	}
	free(text);
	return st;
}

/* kiln_model_create_infer's precheck: every layer took its input's
 * shape (*(int *)arg = 1); it stops the creation before any allocation. */
static kiln_status shapes_taken(void *arg, const struct kiln_model *m)
{
	(void)m;
	*(int *)arg = 1;
	return KILN_ENOTFOUND; /* no message: the caller knows why */
}

/* *fit: every layer of cfg (a folded config of m) takes its input's shape
 * in the layout cfg gives on m's device; when not, the layer's message
 * into why[n] (a layernorm on a 4-d tensor refuses nhwc, where it would
 * normalise over the channels rather than the width).  Built dry: stopped
 * before any allocation. */
static kiln_status shapes_fit(const struct kiln_model *m, const struct kiln_registry *reg,
			      const struct kiln_config *cfg, char *why, size_t n, int *fit)
{
	struct kiln_model *t = NULL;
	int taken = 0;
	const struct kiln_model_precheck pre = { shapes_taken, &taken };
	kiln_status st = kiln_model_create_infer(cfg, reg, m->dev, &m->sample, &pre, &t);
	kiln_model_free(t);
	*fit = taken || !st;
	if (*fit)
		return KILN_OK;
	if (st != KILN_ECONFIG && st != KILN_ENOTSUP) /* a layer's shape check says these */
		return st;
	snprintf(why, n, "%s", kiln_last_error());
	return KILN_OK;
}

/* *out (a folded config of m in the layout `want` gives) replaced by the
 * same in the layout m was trained in, when a layer refuses the first and
 * every layer takes the second, saying why (a later message may name the
 * layout the user did not ask for); else left as it is, and a refusal
 * not of the layout comes from the real build. */
static kiln_status fold_layout(const struct kiln_model *m, struct kiln_registry *reg, int flags,
			       const int *removed, const int *host, const int *into,
			       const int *resid, struct kiln_config **out)
{
	const char *trained = m->layout == KILN_NHWC ? "nhwc" : "nchw";
	struct kiln_config *alt = NULL;
	char why[1024], why2[1024];
	int fit = 1, fit2 = 0;
	kiln_status st;
	if (kiln_model_layout(*out, m->dev) == m->layout ||
	    (st = shapes_fit(m, reg, *out, why, sizeof why, &fit)) || fit)
		return fit ? KILN_OK : st;
	if ((st = fold_load(m, reg, trained, removed, host, into, resid, &alt)) ||
	    (st = shapes_fit(m, reg, alt, why2, sizeof why2, &fit2)) || !fit2) {
		kiln_config_free(alt);
		return st;
	}
	kiln_log(KILN_LOG_INFO, "infer", "the folded model keeps [model] layout = %s (the trained model's): %s%s refused: %s",
		 trained, kiln_model_layout(*out, m->dev) == KILN_NHWC ? "nhwc" : "nchw",
		 flags & KILN_FOLD_INT8 ? " (where oneDNN's INT8 convolutions have direct kernels)"
					: " (the device's)", why);
	kiln_config_free(*out);
	*out = alt;
	return KILN_OK;
}

kiln_status kiln_infer_fold_config_ex(const struct kiln_model *m, struct kiln_registry *reg,
				      int flags, struct kiln_config **out, int *n_folded)
{
	const size_t nl = (size_t)m->n_layers + 1;
	int *removed = calloc(nl, sizeof *removed), *host = calloc(nl, sizeof *host);
	int *into = calloc(nl, sizeof *into), *resid = calloc(nl, sizeof *resid);
	/* INT8: oneDNN's int8 convolutions have direct (jit) kernels for
	 * channels-last only; nchw gets a reference loop */
	const char *want = flags & KILN_FOLD_INT8 ? "nhwc" : "auto";
	kiln_status st;
	*out = NULL;
	if (!removed || !host || !into || !resid) {
		st = kiln_error(KILN_ENOMEM, "out of memory");
		goto out;
	}
	int n = fold_plan(m, removed, host, 1);
	if (flags & KILN_FOLD_RESIDUAL)
		n += residual_plan(m, removed, into, resid);
	else
		for (int j = 0; j < m->n_layers; j++)
			into[j] = -1, resid[j] = -2;
	if (n_folded)
		*n_folded = n;
	if (!(st = fold_load(m, reg, want, removed, host, into, resid, out)))
		st = fold_layout(m, reg, flags, removed, host, into, resid, out);
out:
	if (st) {
		kiln_config_free(*out);
		*out = NULL;
	}
	free(removed);
	free(host);
	free(into);
	free(resid);
	return st;
}

/* ---- the folded weights ----------------------------------------------- */

/* The parameter named "<layer>.<suffix>" of m, NULL when there is none. */
static const struct model_param *param_of(const struct kiln_model *m, const char *layer,
					  const char *suffix)
{
	char name[2 * sizeof m->params[0].name]; /* layer + suffix */
	snprintf(name, sizeof name, "%s.%s", layer, suffix);
	for (int i = 0; i < m->n_params; i++)
		if (!strcmp(m->params[i].name, name))
			return &m->params[i];
	return NULL;
}

/* A parameter's values in the host copies of its model's two regions. */
static float *host_of(const struct model_param *p, float *params, float *buffers)
{
	return (p->buffer ? buffers : params) + p->off;
}

kiln_status kiln_model_regions_copy(const struct kiln_model *m, float *params, float *buffers, int up,
				void *stream)
{
	const int dir = up ? KILN_COPY_H2D : KILN_COPY_D2H;
	kiln_status st = KILN_OK;
	if (m->n_elems)
		st = kiln_device_copy_async(m->dev, up ? (void *)m->params_d : params,
					    up ? (void *)params : m->params_d,
					    m->n_elems * sizeof(float), dir, stream);
	if (!st && m->n_buf_elems)
		st = kiln_device_copy_async(m->dev, up ? (void *)m->buffers_d : buffers,
					    up ? (void *)buffers : m->buffers_d,
					    m->n_buf_elems * sizeof(float), dir, stream);
	return st ? st : kiln_device_stream_sync(m->dev, stream);
}

/* Layer li of src (a conv or linear) with batchnorm bj folded in: its
 * weight [O, ...] and bias [O] into dst's w and b. */
static kiln_status fold_one(const struct kiln_model *src, int li, int bj, const float *sp,
			    const float *sb, float *w, float *b)
{
	const char *bn = src->layers[bj].name, *ln = src->layers[li].name;
	const struct model_param *pw = param_of(src, ln, "weight"), *pb = param_of(src, ln, "bias");
	const struct model_param *g = param_of(src, bn, "weight"), *beta = param_of(src, bn, "bias");
	const struct model_param *mu = param_of(src, bn, "running_mean");
	const struct model_param *var = param_of(src, bn, "running_var");
	double eps = 1e-5;
	kiln_config_get_float(src->cfg, src->layers[bj].section, "eps", &eps);
	if (!pw || !g || !beta || !mu || !var)
		return kiln_error(KILN_EINVAL, "folding batchnorm '%s' into '%s': a parameter is missing",
				  bn, ln);
	const int64_t O = pw->desc.dims[0], per = pw->numel / O;
	for (int64_t o = 0; o < O; o++) {
		const float *gp = host_of(g, (float *)sp, (float *)sb);
		double scale = gp[o] / sqrt((double)host_of(var, (float *)sp, (float *)sb)[o] + eps);
		double bias = pb ? host_of(pb, (float *)sp, (float *)sb)[o] : 0.0;
		double mean = host_of(mu, (float *)sp, (float *)sb)[o];
		const float *wo = host_of(pw, (float *)sp, (float *)sb) + o * per;
		for (int64_t e = 0; e < per; e++)
			w[o * per + e] = (float)(wo[e] * scale);
		b[o] = (float)(host_of(beta, (float *)sp, (float *)sb)[o] + (bias - mean) * scale);
	}
	return KILN_OK;
}

/* dst's parameter p from src's host copies (sp, sb): layer li of src took
 * batchnorm host[li] (a folded weight or bias), else copied by name. */
static kiln_status fill_param(const struct kiln_model *src, const struct model_param *p,
			      const int *host, const float *sp, const float *sb, float *dp, float *db)
{
	float *to = host_of(p, dp, db);
	const char *dot = strrchr(p->name, '.');
	char layer[sizeof p->name];
	snprintf(layer, sizeof layer, "%.*s", (int)(dot - p->name), p->name);
	const int li = kiln_model_find_layer(src, src->n_layers, layer);
	if (li >= 0 && host[li] >= 0) {
		/* weight and bias computed together; each fill writes its own */
		const struct model_param *w = param_of(src, layer, "weight");
		const int64_t O = w->desc.dims[0];
		float *wbuf = malloc(sizeof(float) * (size_t)(w->numel + O));
		if (!wbuf)
			return kiln_error(KILN_ENOMEM, "out of memory");
		kiln_status st = fold_one(src, li, host[li], sp, sb, wbuf, wbuf + w->numel);
		if (!st && !strcmp(dot + 1, "weight"))
			memcpy(to, wbuf, sizeof(float) * (size_t)w->numel);
		else if (!st)
			memcpy(to, wbuf + w->numel, sizeof(float) * (size_t)O);
		free(wbuf);
		return st;
	}
	const struct model_param *q = NULL;
	for (int i = 0; i < src->n_params && !q; i++)
		if (!strcmp(src->params[i].name, p->name))
			q = &src->params[i];
	if (!q || q->numel != p->numel)
		return kiln_error(KILN_EINVAL, "the folded model's parameter '%s' has no match in the trained model",
				  p->name);
	memcpy(to, host_of(q, (float *)sp, (float *)sb), sizeof(float) * (size_t)p->numel);
	return KILN_OK;
}

/* src's parameters and buffers in host memory (f32, its regions' layout). */
struct kiln_fold_host {
	float *sp; /* [src->n_elems] */
	float *sb; /* [src->n_buf_elems] */
};

kiln_status kiln_infer_fold_read(const struct kiln_model *src, void *src_stream,
				 struct kiln_fold_host **out)
{
	struct kiln_fold_host *h = calloc(1, sizeof *h);
	*out = NULL;
	if (!h || !(h->sp = malloc(sizeof(float) * (src->n_elems + 1))) ||
	    !(h->sb = malloc(sizeof(float) * (src->n_buf_elems + 1)))) {
		kiln_infer_fold_host_free(h);
		return kiln_error(KILN_ENOMEM, "folding the model for inference: a host copy of its weights (%s): out of memory",
				  kiln_bytes_str((char[32]){ 0 }, 32,
						 (double)sizeof(float) *
							 (double)(src->n_elems + src->n_buf_elems + 2)));
	}
	kiln_status st = kiln_model_regions_copy(src, h->sp, h->sb, 0, src_stream);
	if (st) {
		kiln_infer_fold_host_free(h);
		return st;
	}
	*out = h;
	return KILN_OK;
}

void kiln_infer_fold_host_free(struct kiln_fold_host *h)
{
	if (!h)
		return;
	free(h->sp);
	free(h->sb);
	free(h);
}

kiln_status kiln_infer_fold_write(const struct kiln_model *src, struct kiln_fold_host *h,
				  struct kiln_model *dst, void *dst_stream)
{
	int *removed = calloc((size_t)src->n_layers, sizeof *removed);
	int *host = calloc((size_t)src->n_layers, sizeof *host);
	float *dp = calloc(dst->n_elems + 1, sizeof(float));
	float *db = calloc(dst->n_buf_elems + 1, sizeof(float));
	kiln_status st = KILN_OK;
	if (!removed || !host || !dp || !db) {
		st = kiln_error(KILN_ENOMEM, "folding the model for inference: a host copy of its folded weights (%s): out of memory",
				kiln_bytes_str((char[32]){ 0 }, 32,
					       (double)sizeof(float) *
						       (double)(dst->n_elems + dst->n_buf_elems + 2)));
		goto out;
	}
	fold_plan(src, removed, host, 0);
	for (int i = 0; i < dst->n_params && !st; i++)
		st = fill_param(src, &dst->params[i], host, h->sp, h->sb, dp, db);
	/* src's copy is not needed once dst's is computed: freed before dst's
	 * weights are written (one host copy fewer at the peak) */
	free(h->sp);
	free(h->sb);
	h->sp = h->sb = NULL;
	if (!st)
		st = kiln_model_regions_copy(dst, dp, db, 1, dst_stream);
	kiln_model_weights_written(dst);
	dst->tracked_base = src->tracked_base;
out:
	free(removed);
	free(host);
	free(dp);
	free(db);
	return st;
}

kiln_status kiln_infer_fold_weights(const struct kiln_model *src, void *src_stream,
				    struct kiln_model *dst, void *dst_stream)
{
	struct kiln_fold_host *h;
	kiln_status st = kiln_infer_fold_read(src, src_stream, &h);
	if (!st)
		st = kiln_infer_fold_write(src, h, dst, dst_stream);
	kiln_infer_fold_host_free(h);
	return st;
}

int64_t kiln_infer_block_rows(int64_t batch, size_t act_row, size_t weight_bytes, size_t budget)
{
	int64_t r = 1;
	if (batch <= 1 || !act_row || act_row * (size_t)batch <= budget)
		return batch;
	while (r * 2 < batch && act_row * (size_t)(r * 2) <= budget)
		r *= 2;
	return weight_bytes > act_row * (size_t)r ? batch : r;
}
