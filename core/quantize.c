/* core/quantize.c - INT8 post-training quantization of a (folded) model:
 * observe every conv and linear input over calibration batches, write
 * the quantized file, and read it back for evaluation.  The math is in
 * quant.c, the file in quant.h and docs/formats.md. */
#include "quant.h"
#include "checkpoint.h"
#include "infer_passes.h"
#include "config_impl.h" /* lookup_key: int8_scale's range */
#include "../plugins/common/c_locale.h" /* common_strtod, common_snprintf_c */
#include "../plugins/common/open_file.h" /* common_open_file: no FIFO blocks */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h> /* close */

#define QUANT_FORMAT "kiln-int8/1" /* the file's metadata kiln.format */
/* its CRC32Cs (since session 40; a file without them loads unchecked) */

struct kiln_quant_calib {
	int n;
	int *layer;                      /* the quantized layers' indices */
	struct kiln_quant_observer *obs; /* [n]: their inputs */
	int64_t batches;                 /* calibration batches seen */
	float *host;                     /* the largest input's copy */
	size_t host_elems;
};

/* Convolutions with fewer input channels per group than this stay f32:
 * oneDNN's int8 kernels take input channels in fours (one vpmaddubsw /
 * vpmaddwd lane), so an image model's first layer (1 or 3 channels) pads
 * to 4 and ran 1.3x slower than f32 (docs/PERFORMANCE.md, "INT8
 * evaluation at 2x"), and its input is the one quantization hurts most. */
#define QUANT_MIN_CHANNELS 4

static int quantizable(const struct kiln_model *m, int i)
{
	const struct model_layer *L = &m->layers[i];
	const char *t = L->type->name;
	if (L->n_in != 1)
		return 0;
	if (!strcmp(t, "conv"))
		return m->params[L->pidx[0]].desc.dims[1] >= QUANT_MIN_CHANNELS;
	return !strcmp(t, "linear");
}

/* Why nothing of m is quantized: every conv it has stays f32 for its few
 * input channels (the first such conv named), or it has neither. */
static kiln_status none_to_quantize(const struct kiln_model *m)
{
	for (int i = 0; i < m->n_layers; i++) {
		const struct model_layer *L = &m->layers[i];
		if (L->n_in == 1 && !strcmp(L->type->name, "conv"))
			return kiln_error(KILN_EINVAL, "nothing to quantize: the model has no linear layer, and its convs stay f32 with fewer than %d input channels per group (conv '%s' has %lld; oneDNN's int8 kernels take them in fours)",
					  QUANT_MIN_CHANNELS, L->name,
					  (long long)m->params[L->pidx[0]].desc.dims[1]);
	}
	return kiln_error(KILN_EINVAL, "the model has no conv or linear layer to quantize");
}

kiln_status kiln_quant_calib_new(const struct kiln_model *m, struct kiln_quant_calib **out)
{
	struct kiln_quant_calib *q = calloc(1, sizeof *q);
	*out = NULL;
	if (!q || !(q->layer = calloc((size_t)m->n_layers, sizeof *q->layer)) ||
	    !(q->obs = calloc((size_t)m->n_layers, sizeof *q->obs))) {
		kiln_quant_calib_free(q);
		return kiln_error(KILN_ENOMEM, "out of memory");
	}
	for (int i = 0; i < m->n_layers; i++)
		if (quantizable(m, i))
			q->layer[q->n++] = i;
	if (!q->n) {
		kiln_quant_calib_free(q);
		return none_to_quantize(m);
	}
	*out = q;
	return KILN_OK;
}

void kiln_quant_calib_free(struct kiln_quant_calib *q)
{
	if (!q)
		return;
	free(q->layer);
	free(q->obs);
	free(q->host);
	free(q);
}

/* The input of layer i in plan p: the data x (also through a view of it,
 * the MLP's flatten, which the plan keeps no copy of), or its producer's
 * output. */
static kiln_status input_of(struct kiln_plan *p, int i, const void *x, int64_t rows,
			    const void **ptr, int64_t *n)
{
	const struct kiln_model *m = p->m;
	const int j = m->layers[i].in[0];
	struct kiln_tensor_desc d;
	if (j < 0 || kiln_plan_root_y(p->nodes, m, j) < 0) {
		*ptr = x;
		*n = rows * kiln_tensor_numel(&m->sample);
		return KILN_OK;
	}
	void *y;
	kiln_status st = kiln_plan_tensor(p, m->layers[j].name, "y", &y, &d);
	if (st)
		return st;
	if (d.dtype != KILN_F32)
		return kiln_error(KILN_ENOTSUP, "calibration reads f32 activations ([run] precision = fp32); layer '%s' gives %s",
				  m->layers[j].name, kiln_dtype_name(d.dtype));
	*ptr = y;
	*n = kiln_tensor_numel(&d) / d.dims[0] * rows;
	return KILN_OK;
}

kiln_status kiln_quant_calib_batch(struct kiln_quant_calib *q, struct kiln_plan *p, const void *x,
				   int64_t rows, void *stream)
{
	struct kiln_device *dev = p->m->dev;
	kiln_status st;
	for (int k = 0; k < q->n; k++) {
		const void *src = NULL;
		int64_t n = 0;
		if ((st = input_of(p, q->layer[k], x, rows, &src, &n)))
			return st;
		if ((size_t)n > q->host_elems) {
			free(q->host);
			q->host_elems = 0;
			if (!(q->host = malloc(sizeof(float) * (size_t)n)))
				return kiln_error(KILN_ENOMEM, "out of memory");
			q->host_elems = (size_t)n;
		}
		if ((st = kiln_device_copy_async(dev, q->host, src, sizeof(float) * (size_t)n,
						 KILN_COPY_D2H, stream)) ||
		    (st = kiln_device_stream_sync(dev, stream)))
			return st;
		kiln_quant_observe(&q->obs[k], q->host, n);
	}
	q->batches++;
	return KILN_OK;
}

/* ---- the file ----------------------------------------------------------- */

/* f32 host copies of m's params and buffers regions (the caller frees). */
static kiln_status host_regions(const struct kiln_model *m, void *stream, float **pp, float **bp)
{
	*pp = malloc(sizeof(float) * (m->n_elems + 1));
	*bp = malloc(sizeof(float) * (m->n_buf_elems + 1));
	if (!*pp || !*bp)
		return kiln_error(KILN_ENOMEM, "out of memory");
	return kiln_model_regions_copy(m, *pp, *bp, 0, stream);
}

/* The calibrated layer whose weight p is, else -1. */
static int quantized_weight(const struct kiln_quant_calib *q, const struct kiln_model *m,
			    const struct model_param *p)
{
	for (int k = 0; k < q->n; k++)
		if (p->layer == q->layer[k] && p->slot == 0 && !p->buffer)
			return k;
	return -1;
}

/* A layer's weight, quantized, and its scales into w.  The writer borrows
 * the data until it writes: the buffers go to keep[0..1] (the caller
 * frees them after the write). */
static kiln_status add_weight(struct kiln_safetensors_writer *w, const struct model_param *p,
			      const float *v, void **keep)
{
	const int64_t O = p->desc.dims[0], per = p->numel / O;
	int8_t *q = keep[0] = malloc((size_t)p->numel);
	float *scale = keep[1] = malloc(sizeof(float) * (size_t)O);
	char name[sizeof p->name + 8];
	kiln_status st;
	if (!q || !scale)
		return kiln_error(KILN_ENOMEM, "out of memory");
	kiln_quant_weights(v, O, per, q, scale);
	snprintf(name, sizeof name, "%s_scale", p->name);
	if (!(st = kiln_safetensors_writer_add(w, p->name, KILN_I8, p->desc.ndim, p->desc.dims, q)))
		st = kiln_safetensors_writer_add(w, name, KILN_F32, 1, &O, scale);
	return st;
}

/* Layer k's input scale (F32 [1], at *sx until the write) and its
 * "X.input" metadata. */
static kiln_status add_input(struct kiln_safetensors_writer *w, const struct kiln_quant_calib *q,
			     const struct kiln_model *m, int k, int method, double pct, float *sx)
{
	const struct kiln_quant_observer *o = &q->obs[k];
	const char *name = m->layers[q->layer[k]].name;
	char key[200];
	int is_u;
	const int64_t one = 1;
	int fell_back;
	const double amax = kiln_quant_amax_ex(o, method, pct, &fell_back);
	kiln_status st;
	if (fell_back)
		kiln_log(KILN_LOG_WARN, "quantize", "%s: the entropy rule's amax for its input in [%g, %g] keeps one level (at or below every value seen, or one histogram bin below it): min-max's amax %g instead",
			 name, o->min, o->max, amax);
	*sx = kiln_quant_act_scale(o, amax, &is_u);
	snprintf(key, sizeof key, "%s.input_scale", name);
	if ((st = kiln_safetensors_writer_add(w, key, KILN_F32, 1, &one, sx)))
		return st;
	kiln_log(KILN_LOG_INFO, "quantize", "%s: input %s in [%g, %g], amax %g, scale %g", name,
		 is_u ? "u8" : "s8", o->min, o->max, amax, *sx);
	snprintf(key, sizeof key, "%s.input", name);
	return kiln_safetensors_writer_meta(w, key, is_u ? "u8" : "s8");
}

/* The config and the keys of it that shape the tensors (a checkpoint's
 * "config" and "weights_keys"), for kiln_quant_config_check. */
static kiln_status add_config(struct kiln_safetensors_writer *w, const char *config)
{
	char *wkeys = kiln_ckpt_weights_keys(config);
	kiln_status st = wkeys ? kiln_safetensors_writer_meta(w, "kiln.config", config) : KILN_ENOMEM;
	if (!st)
		st = kiln_safetensors_writer_meta(w, "kiln.weights_keys", wkeys);
	free(wkeys);
	return st;
}

static kiln_status add_meta(struct kiln_safetensors_writer *w, int method, int64_t batches,
			    int64_t step, const char *config)
{
	static const char *const names[] = { "minmax", "percentile", "entropy" };
	char v[32];
	kiln_status st;
	if ((st = kiln_safetensors_writer_meta(w, "kiln.format", QUANT_FORMAT)) ||
	    (st = kiln_safetensors_writer_meta(w, "kiln.method", names[method])) ||
	    (st = add_config(w, config)))
		return st;
	snprintf(v, sizeof v, "%lld", (long long)batches);
	if ((st = kiln_safetensors_writer_meta(w, "kiln.calibrate_batches", v)))
		return st;
	snprintf(v, sizeof v, "%lld", (long long)step);
	return kiln_safetensors_writer_meta(w, "kiln.step", v);
}

/* ---- the input sample (session 39) --------------------------------------
 * "kiln.sample": the model's input sample, as a checkpoint's "sample"
 * section has it ("f32 1,28,28", kiln_ckpt_sample_text without its
 * newline), so that the INT8 model is built without [data]. */

static kiln_status add_sample(struct kiln_safetensors_writer *w,
			      const struct kiln_tensor_desc *sample)
{
	char text[160];
	kiln_ckpt_sample_text(sample, text, sizeof text);
	text[strcspn(text, "\n")] = '\0';
	return kiln_safetensors_writer_meta(w, "kiln.sample", text);
}

kiln_status kiln_quant_sample(const struct kiln_safetensors *f, struct kiln_tensor_desc *out)
{
	const char *v = kiln_safetensors_meta(f, "kiln.sample");
	if (!v)
		return kiln_error(KILN_ENOTFOUND, "%s records no input sample (metadata kiln.sample: a kiln before session 39 wrote it)",
				  kiln_safetensors_path(f));
	if (kiln_ckpt_sample_parse(v, '\0', out))
		return kiln_error(KILN_EDATA, "%s: metadata kiln.sample is '%.60s', want DTYPE D0,D1,... of at most 2^31 elements (f32 1,28,28)",
				  kiln_safetensors_path(f), v);
	return KILN_OK;
}

kiln_status kiln_quant_write(const struct kiln_quant_calib *q, const struct kiln_model *m,
			     void *stream, int method, double pct, int64_t step, const char *config,
			     const char *path)
{
	struct kiln_safetensors_writer *w = NULL;
	float *pp = NULL, *bp = NULL, *sx = calloc((size_t)q->n, sizeof *sx);
	void **keep = calloc(2 * (size_t)q->n, sizeof *keep); /* the borrowed buffers */
	kiln_status st;
	if (!sx || !keep) {
		st = kiln_error(KILN_ENOMEM, "out of memory");
		goto out;
	}
	if ((st = host_regions(m, stream, &pp, &bp)) || (st = kiln_safetensors_writer_new(&w)))
		goto out;
	for (int i = 0; i < m->n_params && !st; i++) {
		const struct model_param *p = &m->params[i];
		const float *v = (p->buffer ? bp : pp) + p->off;
		const int k = quantized_weight(q, m, p);
		if (k >= 0)
			st = add_weight(w, p, v, keep + 2 * k);
		else
			st = kiln_safetensors_writer_add(w, p->name, KILN_F32, p->desc.ndim, p->desc.dims, v);
	}
	for (int k = 0; k < q->n && !st; k++)
		st = add_input(w, q, m, k, method, pct, &sx[k]);
	if (!st)
		st = add_sample(w, &m->sample);
	if (!st && !(st = add_meta(w, method, q->batches, step, config)) &&
	    !(st = kiln_safetensors_writer_crc(w, KILN_ST_CRC_KEY)))
		st = kiln_safetensors_writer_write(w, path);
out:
	kiln_safetensors_writer_free(w);
	for (int k = 0; keep && k < 2 * q->n; k++)
		free(keep[k]);
	free(keep);
	free(sx);
	free(pp);
	free(bp);
	return st;
}

/* ---- reading it back ------------------------------------------------------ */

kiln_status kiln_quant_no_weights(const char *quantized, const char *weights)
{
	if (quantized && weights)
		return kiln_error(KILN_EUSAGE, "%s: a quantized model carries its weights: no checkpoint or weights file with it (got %s)",
				  quantized, weights);
	return KILN_OK;
}

kiln_status kiln_quant_open(const char *path, struct kiln_safetensors **out)
{
	char kind[64];
	const char *why;
	*out = NULL;
	/* opened once: the file told apart is the file read (session 39) */
	struct kiln_file_seen seen;
	int fd = common_open_file(path, kind, sizeof kind, &why, NULL);
	if (fd < 0)
		return kiln_error(KILN_EIO, "%s: cannot open: %s", path, why);
	kiln_status st = kiln_file_seen_fd(fd, path, &seen);
	if (!st)
		st = kiln_ckpt_is_checkpoint_fd(fd)
			? kiln_error(KILN_EUSAGE, "%s: this is a kiln checkpoint, not an INT8 model of `kiln quantize`: pass it with --checkpoint (the C API: as the weights), or quantize it first (kiln quantize --checkpoint %s --out Q)",
				     path, path)
			: kiln_safetensors_open_fd(path, fd, &seen, out);
	close(fd);
	/* its CRC32Cs: a byte changed since kiln quantize wrote it (a bad
	 * copy, a disk) is refused, the header's now, each tensor's as it is
	 * read (kiln_safetensors_read), before its values are used: one pass
	 * over the bytes (before session 43 the whole file was read here to
	 * check it, then again to load it, as safetensors files were before
	 * session 42); a file of a kiln before session 40 has none and loads
	 * as before */
	int had;
	if (!st && (st = kiln_safetensors_crc_reads(*out, KILN_ST_CRC_KEY, &had))) {
		kiln_safetensors_close(*out);
		*out = NULL;
	}
	return st;
}

kiln_status kiln_quant_config_check(const struct kiln_safetensors *f, const struct kiln_config *cfg,
				    const struct kiln_registry *reg)
{
	const char *saved = kiln_safetensors_meta(f, "kiln.config");
	const char *wkeys = kiln_safetensors_meta(f, "kiln.weights_keys");
	if (!saved) {
		kiln_log(KILN_LOG_WARN, "quantize", "%s records no config (a kiln before session 29 wrote it): its tensors alone are checked against the model",
			 kiln_safetensors_path(f));
		return KILN_OK;
	}
	char *current = kiln_ckpt_config_text(cfg, reg), *defaults = kiln_ckpt_config_defaults(cfg, reg);
	kiln_status st = current && defaults ? KILN_OK : KILN_ENOMEM;
	/* the callers name the file */
	if (!st)
		st = kiln_ckpt_config_check("the quantized file", saved, current, wkeys ? wkeys : "", defaults,
					    cfg);
	free(current);
	free(defaults);
	return st;
}

int kiln_quant_is_model(const struct kiln_safetensors *f)
{
	const char *v = kiln_safetensors_meta(f, "kiln.format");
	return v && !strcmp(v, QUANT_FORMAT);
}

kiln_status kiln_quant_need_fp32(const struct kiln_config *cfg, const char *what)
{
	const char *p = kiln_config_get(cfg, "run", "precision");
	if (!p || !strcmp(p, "fp32"))
		return KILN_OK;
	return kiln_error(KILN_ECONFIG, "%s: [run] precision = %s: %s: drop [run] precision",
			  kiln_config_where(cfg, "run", "precision"), p, what);
}

static kiln_status need_format(const struct kiln_safetensors *f)
{
	const char *v = kiln_safetensors_meta(f, "kiln.format");
	if (!kiln_quant_is_model(f))
		return kiln_error(KILN_EDATA, "not a quantized kiln model (metadata kiln.format is %s, want " QUANT_FORMAT ": write one with kiln quantize)",
				  v ? v : "missing");
	return KILN_OK;
}

/* ---- u8 between the INT8 layers (chaining) -------------------------------
 * An INT8 conv or linear whose output only its fused ReLU reads, and that
 * ReLU's output (through max pools and flattens) only INT8 layers with u8
 * inputs of one scale s: the layer writes u8 in s (int8_out_scale), the
 * pools and flattens carry u8, and the readers take it as their quantized
 * input.  max(q(y)) = q(max(y)) for a positive scale, so the readers see
 * what they would have quantized themselves, up to the rounding of the
 * scales (kiln/ops.h, ABI 2.8).  Works on the folded config, whose layers
 * all name their inputs. */

/* Does layer section sec read layer `name`? */
static int reads(const struct kiln_config *cfg, const char *sec, const char *name)
{
	const char *v = kiln_config_get(cfg, sec, "inputs");
	const size_t n = strlen(name);
	while (v && *v) {
		v += strspn(v, ", \t");
		const size_t k = strcspn(v, ", \t");
		if (k == n && !strncmp(v, name, n))
			return 1;
		v += k;
	}
	return 0;
}

static double key_num(const struct kiln_config *cfg, const char *sec, const char *key)
{
	const char *v = kiln_config_get(cfg, sec, key);
	return v ? common_strtod(v, NULL) : 0;
}

/* The readers of layer `name`, through max pools and flattens: *ok stays
 * 1 when every one is an INT8 layer with a u8 input, all of the scale *so
 * (0 before the first). */
static void chain_readers(const struct kiln_config *cfg, const char *name, int depth, double *so,
			  int *ok)
{
	const char *sec;
	int any = 0;
	for (int i = 0; *ok && (sec = kiln_config_section(cfg, i)); i++) {
		if (strncmp(sec, "layer.", 6) || !reads(cfg, sec, name))
			continue;
		const char *t = kiln_config_get(cfg, sec, "type");
		const double sx = key_num(cfg, sec, "int8_scale");
		const char *u = kiln_config_get(cfg, sec, "int8_unsigned");
		any = 1;
		if (t && (!strcmp(t, "maxpool") || !strcmp(t, "flatten")) && depth < 32)
			chain_readers(cfg, sec + 6, depth + 1, so, ok);
		else if (!(sx > 0) || !u || strcmp(u, "1") || (*so > 0 && sx != *so))
			*ok = 0;
		else
			*so = sx;
	}
	*ok = *ok && any;
}

/* The only reader of layer `name` when it is a ReLU: its section, else NULL. */
static const char *only_relu(const struct kiln_config *cfg, const char *name)
{
	const char *sec, *relu = NULL;
	for (int i = 0; (sec = kiln_config_section(cfg, i)); i++) {
		if (strncmp(sec, "layer.", 6) || !reads(cfg, sec, name))
			continue;
		const char *t = kiln_config_get(cfg, sec, "type");
		if (relu || !t || strcmp(t, "relu"))
			return NULL;
		relu = sec;
	}
	return relu;
}

/* A layer that may write u8 for the INT8 layers after it: an INT8 layer,
 * or a residual add of two inputs (f32: what an add reads is never u8,
 * as an add is no INT8 reader), whose ReLU is fused (KILN_OP_ADD's u8
 * output). */
static int may_chain(const struct kiln_config *cfg, const char *sec)
{
	const char *t = kiln_config_get(cfg, sec, "type"), *in = kiln_config_get(cfg, sec, "inputs");
	if (key_num(cfg, sec, "int8_scale") > 0)
		return 1;
	return t && !strcmp(t, "add") && in && strchr(in, ',') && !strchr(strchr(in, ',') + 1, ',');
}

/* int8_out_scale on every layer that can write u8 (see above), on the
 * CPU device (the CUDA INT8 ops take f32) with the ReLU fused, unless
 * the config sets it already (`layer.X.int8_out_scale=0`: no chaining). */
static kiln_status quant_chain(struct kiln_config *cfg)
{
	const char *dev = kiln_config_get(cfg, "run", "device"), *sec;
	const int cpu = !dev || !strncmp(dev, "cpu", 3);
	int fuse = 0, n = 0;
	kiln_model_fuse(cfg, cpu, &fuse);
	if (!fuse || !cpu) {
		kiln_log(KILN_LOG_INFO, "quantize", "INT8 layers exchange f32 (u8 between them needs the CPU device and [run] fuse = 1)");
		return KILN_OK;
	}
	for (int i = 0; (sec = kiln_config_section(cfg, i)); i++) {
		const char *relu;
		double so = 0;
		int ok = 1;
		char arg[400];
		if (strncmp(sec, "layer.", 6) || !may_chain(cfg, sec) ||
		    strcmp(kiln_config_where(cfg, sec, "int8_out_scale"), "default") ||
		    !(relu = only_relu(cfg, sec + 6)))
			continue;
		chain_readers(cfg, relu + 6, 0, &so, &ok);
		if (!ok || !(so > 0))
			continue;
		/* read back by the config (common_strtod): the C locale's '.' */
		common_snprintf_c(arg, sizeof arg, "%s.int8_out_scale=%.9g", sec, so);
		kiln_status st = kiln_config_override(cfg, arg);
		if (st)
			return st;
		kiln_log(KILN_LOG_INFO, "quantize", "layer '%s' writes u8 (scale %g) for the INT8 layers after it",
			 sec + 6, so);
		n++;
	}
	kiln_log(KILN_LOG_INFO, "quantize", "%d INT8 or add layer(s) write u8 for the INT8 layers after them", n);
	return KILN_OK;
}

kiln_status kiln_quant_config(struct kiln_config *cfg, const struct kiln_safetensors *f)
{
	kiln_status st = need_format(f);
	char arg[400];
	/* (the layout: the fold's, KILN_FOLD_INT8: nhwc unless a layer
	 * refuses it) */
	for (int i = 0; !st && kiln_config_section(cfg, i); i++) {
		const char *sec = kiln_config_section(cfg, i);
		struct kiln_safetensors_tensor t;
		if (strncmp(sec, "layer.", 6))
			continue;
		snprintf(arg, sizeof arg, "%s.input_scale", sec + 6);
		const int ti = kiln_safetensors_index(f, arg);
		if (ti < 0)
			continue;
		kiln_safetensors_describe(f, ti, &t);
		float sx;
		if (t.dtype != KILN_F32 || t.numel != 1)
			return kiln_error(KILN_EDATA, "%s: want F32 [1], got %s", arg, t.dtype_name);
		if ((st = kiln_safetensors_read(f, ti, &sx, sizeof sx)))
			return st;
		/* kiln quantize writes a positive finite scale: another value
		 * would leave the layer f32 (int8_scale <= 0) or NaN silently;
		 * one past int8_scale's range (1e30) left it f32 too, and the
		 * layer said "needs int8_scale > 0" (before session 39) */
		const struct kiln_key *k = lookup_key(cfg, sec, "int8_scale");
		if (!(sx > 0) || !isfinite(sx))
			return kiln_error(KILN_EDATA, "%s: %g is no scale (want a positive finite F32)", arg,
					  (double)sx);
		if (k && (double)sx > k->max)
			return kiln_error(KILN_EDATA, "%s: %.9g is out of range (an INT8 layer's int8_scale is at most %g)",
					  arg, (double)sx, k->max);
		snprintf(arg, sizeof arg, "%s.input", sec + 6);
		const char *u = kiln_safetensors_meta(f, arg);
		if (u && strcmp(u, "u8") && strcmp(u, "s8"))
			return kiln_error(KILN_EDATA, "metadata %s is '%.40s', want u8 or s8", arg, u);
		common_snprintf_c(arg, sizeof arg, "%s.int8_scale=%.9g", sec, sx); /* (quant_chain) */
		if (!(st = kiln_config_override(cfg, arg))) {
			snprintf(arg, sizeof arg, "%s.int8_unsigned=%d", sec, u && !strcmp(u, "u8"));
			st = kiln_config_override(cfg, arg);
		}
	}
	return st ? st : quant_chain(cfg);
}

/* I8 tensor ti of f (t: its description) as f32 into v: each of its O
 * rows times its F32 scale, tensor "<name>_scale" of O values. */
static kiln_status load_int8(const struct kiln_safetensors *f, int ti,
			     const struct kiln_safetensors_tensor *t, const struct model_param *p,
			     float *v)
{
	struct kiln_safetensors_tensor s;
	char name[sizeof p->name + 8];
	const int64_t O = p->desc.dims[0], per = p->numel / O;
	snprintf(name, sizeof name, "%s_scale", p->name);
	const int si = kiln_safetensors_index(f, name);
	if (si >= 0)
		kiln_safetensors_describe(f, si, &s);
	if (si < 0 || s.dtype != KILN_F32 || s.numel != O)
		return kiln_error(KILN_EDATA, "'%s': no F32 [%lld] scales", name, (long long)O);
	int8_t *q = malloc(t->bytes + 1);
	float *sc = malloc(s.bytes + 1);
	kiln_status st = q && sc ? KILN_OK : kiln_error(KILN_ENOMEM, "out of memory");
	if (!st && !(st = kiln_safetensors_read(f, ti, q, t->bytes)))
		st = kiln_safetensors_read(f, si, sc, s.bytes);
	for (int64_t o = 0; !st && o < O; o++) {
		if (!(sc[o] > 0) || !isfinite(sc[o]))
			st = kiln_error(KILN_EDATA, "'%s'[%lld]: %g is no scale (want a positive finite F32)",
					name, (long long)o, (double)sc[o]);
		for (int64_t e = 0; !st && e < per; e++) {
			/* the format's 7 bits (docs/formats.md): a wider value
			 * would have been taken as it is before session 39 */
			const int8_t wq = q[o * per + e];
			if (wq < -63 || wq > 63)
				st = kiln_error(KILN_EDATA, "'%s'[%lld][%lld]: %d is outside [-63, 63], the 7-bit weights of " QUANT_FORMAT " (not written by kiln quantize?)",
						p->name, (long long)o, (long long)e, (int)wq);
			else
				v[o * per + e] = (float)wq * sc[o];
		}
	}
	free(q);
	free(sc);
	return st;
}

/* Parameter p of m from the file into v: F32 as it is, I8 times its
 * per-row "_scale". */
static kiln_status load_param(const struct kiln_safetensors *f, const struct model_param *p,
			      float *v)
{
	struct kiln_safetensors_tensor t;
	const int ti = kiln_safetensors_index(f, p->name);
	if (ti < 0)
		return kiln_error(KILN_EDATA, "the quantized file has no '%s' (another model?)", p->name);
	kiln_safetensors_describe(f, ti, &t);
	int same = t.ndim == p->desc.ndim;
	for (int d = 0; same && d < t.ndim; d++)
		same = t.dims[d] == p->desc.dims[d];
	if (!same || (t.dtype != KILN_F32 && t.dtype != KILN_I8))
		return kiln_error(KILN_EDATA, "'%s': %s of %lld elements in %d dims, the model wants %lld f32 in %d",
				  p->name, t.dtype_name, (long long)t.numel, t.ndim, (long long)p->numel,
				  p->desc.ndim);
	if (t.dtype == KILN_F32)
		return kiln_safetensors_read(f, ti, v, sizeof(float) * (size_t)p->numel);
	return load_int8(f, ti, &t, p, v);
}

/* Does m take tensor `name` of the file: a parameter or buffer, a
 * weight's "_scale", a layer's "input_scale"? */
static int model_takes(const struct kiln_model *m, const char *name)
{
	const size_t n = strlen(name);
	for (int i = 0; i < m->n_params; i++) {
		const char *p = m->params[i].name;
		const size_t k = strlen(p);
		if (!strcmp(p, name) || (k + 6 == n && !strncmp(p, name, k) && !strcmp(name + k, "_scale")))
			return 1;
	}
	for (int i = 0; i < m->n_layers; i++) {
		const char *l = m->layers[i].name;
		const size_t k = strlen(l);
		if (k + 12 == n && !strncmp(l, name, k) && !strcmp(name + k, ".input_scale"))
			return 1;
	}
	return 0;
}

/* Every tensor of f one m takes. */
static kiln_status no_extra(const struct kiln_model *m, const struct kiln_safetensors *f)
{
	for (int i = 0; i < kiln_safetensors_count(f); i++) {
		struct kiln_safetensors_tensor t;
		kiln_safetensors_describe(f, i, &t);
		if (!model_takes(m, t.name))
			return kiln_error(KILN_EDATA, "the quantized file has '%s', a tensor this model does not take (another model?)",
					  t.name);
	}
	return KILN_OK;
}

kiln_status kiln_quant_load(struct kiln_model *m, const struct kiln_safetensors *f, void *stream)
{
	float *pp = calloc(m->n_elems + 1, sizeof(float));
	float *bp = calloc(m->n_buf_elems + 1, sizeof(float));
	kiln_status st = pp && bp ? need_format(f) : kiln_error(KILN_ENOMEM, "out of memory");
	for (int i = 0; i < m->n_params && !st; i++) {
		const struct model_param *p = &m->params[i];
		st = load_param(f, p, (p->buffer ? bp : pp) + p->off);
	}
	if (!st)
		st = no_extra(m, f);
	/* its F32 tensors (biases, batchnorm statistics) finite too: the
	 * scales are checked above */
	if (!st)
		st = kiln_model_finite_check(m, "the quantized file", 0, 0, pp, m->n_elems);
	if (!st)
		st = kiln_model_finite_check(m, "the quantized file", 1, 0, bp, m->n_buf_elems);
	if (!st)
		st = kiln_model_regions_copy(m, pp, bp, 1, stream);
	kiln_model_weights_written(m);
	free(pp);
	free(bp);
	return st;
}
