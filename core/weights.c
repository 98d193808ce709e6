/* core/weights.c - the model's parameters and buffers to and from
 * safetensors files (docs/safetensors.md): kiln_model_save_safetensors,
 * kiln_model_load_safetensors and [model] init_from.  `kiln export` and
 * the weights a command names: core/trained.c.
 *
 * A tensor's name is its model_param name ("<layer>.<suffix>"), its shape
 * the parameter's (PyTorch's layouts), its bytes f32.  Batchnorm layers
 * also carry PyTorch's "<layer>.num_batches_tracked", an i64 scalar kiln
 * does not use: written as the count loaded with the weights plus the
 * model's micro-steps since, read back into that count.  A tied tensor
 * (core/tie.c) is one parameter, written once under its owner's name as
 * PyTorch and Hugging Face do; it reads from that name, or from a tied
 * layer's ("lm_head.weight") when the file has only that, and a file with
 * both must hold the same values under both.
 *
 * The GPT-2 format (KILN_WEIGHTS_GPT2, `kiln export --format gpt2`,
 * [model] init_format = gpt2) keeps these names and stores the blocks'
 * Conv1D weights [in, out]; llm.c's model files load through the same
 * loader (core/weights_gpt2.c).
 *
 * An export records the [layer.*] sections it was made from (metadata
 * kiln.layers, since session 41), which a load compares with its model's
 * before reading a tensor (check_exported): the same shapes can compute
 * another function (attention heads, an activation, a norm's eps).
 */
#include "checkpoint.h"
#include "config_diff.h" /* struct kiln_config_delta */
#include "weights.h"
#include "graph.h"
#include "quant.h" /* kiln_quant_is_model */
#include "../plugins/common/open_file.h" /* common_open_file: no FIFO blocks */

#include <stdarg.h>
#include <stdio.h>
#include <errno.h>
#include <unistd.h> /* close */

/* ---- save ----------------------------------------------------------------- */

/* Does layer i keep running statistics (PyTorch then has num_batches_tracked)? */
static int tracks_batches(const struct kiln_model *m, int i)
{
	char want[200];
	snprintf(want, sizeof want, "%s.running_mean", m->layers[i].name);
	for (int k = 0; k < m->layers[i].n_params; k++) {
		const struct model_param *p = &m->params[m->layers[i].pidx[k]];
		if (p->buffer && !strcmp(p->name, want))
			return 1;
	}
	return 0;
}

/* The model's resolved [layer.*] sections, each value in its canonical
 * text (kiln_config_write_layers `how`: KILN_LAYERS_CANON, _SET without
 * the unset keys, _DEFAULTS every key at its default): malloc'd, NULL
 * with KILN_ENOMEM set. */
static char *layers_text(const struct kiln_config *cfg, int how)
{
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);
	kiln_status st = f ? kiln_config_write_layers(cfg, f, how) : KILN_ENOMEM;
	if ((f && fclose(f)) || st) {
		free(text);
		kiln_error(KILN_ENOMEM, "out of memory");
		return NULL;
	}
	return text;
}

/* FNV-1a 64 of layers_text: equal for configs that build the same model,
 * however their values are written (`kernel = 5` and `5,5`, `p = 0.10`
 * and `0.1`; before session 36 the bytes were hashed, so such configs had
 * two hashes).  Read back only where a file records no kiln.layers (a
 * kiln before session 41: check_exported). */
static void config_hash(const char *text, char out[17])
{
	uint64_t h = 0xcbf29ce484222325ull;
	for (size_t i = 0; text && text[i]; i++)
		h = (h ^ (unsigned char)text[i]) * 0x100000001b3ull;
	snprintf(out, 17, "%016llx", (unsigned long long)h);
}

/* The parameters in GPT-2's layouts: host's values, every Conv1D weight
 * transposed to [in, out] (a copy, out: n_elems floats). */
static void to_gpt2_layouts(const struct kiln_model *m, const float *host, float *out)
{
	memcpy(out, host, sizeof(float) * m->n_elems);
	for (int i = 0; i < m->n_params; i++) {
		const struct model_param *p = &m->params[i];
		if (p->buffer || !kiln_gpt2_conv1d(m, i))
			continue;
		const int64_t rows = p->desc.dims[0], cols = p->desc.dims[1];
		for (int64_t r = 0; r < rows; r++)
			for (int64_t c = 0; c < cols; c++)
				out[p->off + c * rows + r] = host[p->off + r * cols + c];
	}
}

kiln_status kiln_model_save_safetensors(struct kiln_model *m, const char *path, void *stream)
{
	return kiln_model_save_safetensors_as(m, path, KILN_WEIGHTS_PYTORCH, stream);
}

kiln_status kiln_model_save_safetensors_as(struct kiln_model *m, const char *path, int format,
					   void *stream)
{
	const size_t np = m->n_elems, nb = m->n_buf_elems;
	float *host = NULL, *gpt2 = NULL;
	char *hashed = NULL, *layers = NULL;
	struct kiln_safetensors_writer *w = NULL;
	kiln_status st;
	/* [params | buffers | the i64 step counter] */
	if ((st = kiln_device_host_alloc(m->dev, (np + nb + 2) * sizeof(float), (void **)&host)))
		return st;
	if ((np && (st = kiln_device_copy_async(m->dev, host, m->params_d, np * sizeof(float),
						KILN_COPY_D2H, stream))) ||
	    (nb && (st = kiln_device_copy_async(m->dev, host + np, m->buffers_d, nb * sizeof(float),
						KILN_COPY_D2H, stream))) ||
	    (st = kiln_device_copy_async(m->dev, host + np + nb, m->step_d, sizeof(int64_t),
					 KILN_COPY_D2H, stream)) ||
	    (st = kiln_device_stream_sync(m->dev, stream)))
		goto out;
	int64_t steps, tracked;
	memcpy(&steps, host + np + nb, sizeof steps);
	tracked = m->tracked_base + steps;
	if (format == KILN_WEIGHTS_GPT2) {
		if (!(gpt2 = malloc(sizeof(float) * (np + 1)))) {
			st = kiln_error(KILN_ENOMEM, "%s: out of memory", path);
			goto out;
		}
		to_gpt2_layouts(m, host, gpt2);
	}
	if ((st = kiln_safetensors_writer_new(&w)))
		goto out;
	for (int i = 0; i < m->n_params; i++) {
		const struct model_param *p = &m->params[i];
		const int swap = gpt2 && !p->buffer && kiln_gpt2_conv1d(m, i);
		const int64_t dims[2] = { p->desc.dims[swap], p->desc.dims[!swap] };
		if ((st = kiln_safetensors_writer_add(w, p->name, KILN_F32, p->desc.ndim,
						      swap ? dims : p->desc.dims,
						      (p->buffer ? host + np : gpt2 ? gpt2 : host) + p->off)))
			goto out;
	}
	for (int i = 0; i < m->n_layers; i++) {
		char name[200];
		if (!tracks_batches(m, i))
			continue;
		snprintf(name, sizeof name, "%s.num_batches_tracked", m->layers[i].name);
		if ((st = kiln_safetensors_writer_add(w, name, KILN_I64, 0, NULL, &tracked)))
			goto out;
	}
	char hash[17];
	if (!(hashed = layers_text(m->cfg, KILN_LAYERS_CANON)) ||
	    !(layers = layers_text(m->cfg, KILN_LAYERS_SET))) {
		st = KILN_ENOMEM;
		goto out;
	}
	config_hash(hashed, hash);
	/* the model's sections themselves (since session 41): what a load
	 * compares with its model's (check_exported), their unset keys left
	 * out (since session 42: "; key = (unset)" lines, 8.4 KB of GPT-2
	 * small's 26.4; the hash is of the text with them, as before); and the
	 * CRC32Cs of the header and of each tensor, which the loaders check
	 * (since session 41; kiln quantize's files since 40) */
	if ((st = kiln_safetensors_writer_meta(w, "format", "pt")) ||
	    (st = kiln_safetensors_writer_meta(w, "kiln_version", kiln_version())) ||
	    (st = kiln_safetensors_writer_meta(w, "config_hash", hash)) ||
	    (st = kiln_safetensors_writer_meta(w, "kiln.layers", layers)) ||
	    (st = kiln_safetensors_writer_crc(w, KILN_ST_CRC_KEY)))
		goto out;
	st = kiln_safetensors_writer_write(w, path);
out:
	free(hashed);
	free(layers);
	kiln_safetensors_writer_free(w);
	kiln_device_host_free(m->dev, host);
	free(gpt2);
	return st;
}

/* ---- load ----------------------------------------------------------------- */

/* IEEE half to float, subnormals, infinities and NaNs included. */
float kiln_half_to_float(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, man = h & 0x3ff, u;
	if (e == 0x1f) {
		u = sign | 0x7f800000u | man << 13;
	} else if (e) {
		u = sign | (e + 112) << 23 | man << 13;
	} else if (!man) {
		u = sign;
	} else { /* subnormal: normalise */
		e = 113;
		while (!(man & 0x400)) {
			man <<= 1;
			e--;
		}
		u = sign | e << 23 | (man & 0x3ff) << 13;
	}
	float f;
	memcpy(&f, &u, sizeof f);
	return f;
}

/* Is t of a dtype parameters load from (F32, F16, BF16, F64)? */
static int float_dtype(const struct kiln_safetensors_tensor *t)
{
	return !strcmp(t->dtype_name, "F32") || !strcmp(t->dtype_name, "F16") ||
	       !strcmp(t->dtype_name, "BF16") || !strcmp(t->dtype_name, "F64");
}

/* Tensor t's bytes as the file holds them (raw) as f32 into dst; -1 for a
 * dtype that is not a float. */
static int to_f32(float *dst, const struct kiln_safetensors_tensor *t, const void *raw)
{
	const unsigned char *s = raw;
	if (!strcmp(t->dtype_name, "F32")) {
		memcpy(dst, s, t->bytes);
		return 0;
	}
	for (int64_t i = 0; i < t->numel; i++) {
		if (!strcmp(t->dtype_name, "F16") || !strcmp(t->dtype_name, "BF16")) {
			uint16_t v;
			memcpy(&v, s + 2 * i, 2);
			if (t->dtype_name[0] == 'F') {
				dst[i] = kiln_half_to_float(v);
			} else {
				uint32_t u = (uint32_t)v << 16;
				memcpy(&dst[i], &u, 4);
			}
		} else if (!strcmp(t->dtype_name, "F64")) {
			double d;
			memcpy(&d, s + 8 * i, 8);
			dst[i] = (float)d;
		} else {
			return -1;
		}
	}
	return 0;
}

/* Tensor j of `in` (a float dtype) as f32 into dst (its numel floats):
 * read into dst itself when the file holds F32, else into raw (room for
 * its bytes) and converted. */
static kiln_status read_f32(const struct kiln_weights_in *in, int j, float *dst, void *raw)
{
	const struct kiln_safetensors_tensor *t = &in->t[j];
	const int f32 = !strcmp(t->dtype_name, "F32");
	kiln_status st = in->read(in, j, f32 ? (void *)dst : raw);
	if (!st && !f32)
		to_f32(dst, t, raw);
	return st;
}

/* "a, b, c (and 4 more)": the first few names of a list, for messages. */
struct names {
	char text[400];
	int n;
};

static void names_add(struct names *l, const char *fmt, ...) KILN_PRINTF(2, 3);
static void names_add(struct names *l, const char *fmt, ...)
{
	if (l->n++ < 4) {
		size_t o = strlen(l->text);
		va_list ap;
		if (o && o < sizeof l->text)
			o += (size_t)snprintf(l->text + o, sizeof l->text - o, ", ");
		va_start(ap, fmt);
		if (o < sizeof l->text)
			vsnprintf(l->text + o, sizeof l->text - o, fmt, ap);
		va_end(ap);
	}
}

/* "(and N more)" when the list was cut, else "". */
static const char *names_more(const struct names *l, char *buf, size_t n)
{
	buf[0] = 0;
	if (l->n > 4)
		snprintf(buf, n, " (and %d more)", l->n - 4);
	return buf;
}

static char *shape_str(int ndim, const int64_t *dims, char *buf, size_t n)
{
	size_t o = (size_t)snprintf(buf, n, "[");
	for (int i = 0; i < ndim && o < n; i++)
		o += (size_t)snprintf(buf + o, n - o, i ? ", %lld" : "%lld", (long long)dims[i]);
	if (o < n)
		snprintf(buf + o, n - o, "]");
	return buf;
}

static int is_tracked_name(const char *name)
{
	static const char suffix[] = ".num_batches_tracked";
	size_t n = strlen(name), k = sizeof suffix - 1;
	return n > k && !strcmp(name + n - k, suffix);
}

/* Does the file's tensor `name` hold parameter i, by the file's names? */
static int same_name(const struct kiln_model *m, const struct kiln_weights_in *in, int i,
		     const char *name)
{
	if (in->flags & KILN_WF_GPT2_NAMES)
		return kiln_gpt2_same_name(m, i, name);
	return !strcmp(m->params[i].name, name);
}

/* The file's entry for parameter i: its name, else (a tied tensor) an
 * alias of it ("lm_head.weight" of [layer.lm_head] tie = wte); -1 when
 * the file has neither. */
static int find_entry(const struct kiln_model *m, const struct kiln_weights_in *in, int i)
{
	int alias = -1;
	for (int j = 0; j < in->n; j++) {
		if (same_name(m, in, i, in->t[j].name))
			return j;
		if (alias < 0 && kiln_model_tie_alias(m, in->t[j].name) == i)
			alias = j;
	}
	return alias;
}

/* Do tensors ja and jb of `in` hold the same shape and the same values,
 * as f32 (*same)?  (A tied tensor's two names in one file must.) */
static kiln_status same_values(const struct kiln_weights_in *in, int ja, int jb, int *same)
{
	const struct kiln_safetensors_tensor *a = &in->t[ja], *b = &in->t[jb];
	*same = a->ndim == b->ndim && a->numel == b->numel && float_dtype(a) && float_dtype(b);
	for (int d = 0; *same && d < a->ndim; d++)
		*same = a->dims[d] == b->dims[d];
	if (!*same)
		return KILN_OK;
	float *x = malloc(sizeof(float) * (size_t)(a->numel + 1));
	float *y = malloc(sizeof(float) * (size_t)(b->numel + 1));
	void *raw = malloc((a->bytes > b->bytes ? a->bytes : b->bytes) + 1);
	kiln_status st = x && y && raw ? KILN_OK : kiln_error(KILN_ENOMEM, "out of memory");
	if (!st && !(st = read_f32(in, ja, x, raw)) && !(st = read_f32(in, jb, y, raw)))
		*same = !memcmp(x, y, sizeof(float) * (size_t)a->numel);
	free(x);
	free(y);
	free(raw);
	return st;
}

/* Is parameter i stored [in, out] in this file (GPT-2's Conv1D)? */
static int transposed(const struct kiln_model *m, const struct kiln_weights_in *in, int i)
{
	return (in->flags & KILN_WF_CONV1D) && kiln_gpt2_conv1d(m, i);
}

/* Does tensor t fit parameter i: its shape (transposed for a Conv1D
 * weight; fewer rows for a padded vocabulary) and a float dtype?  Adds
 * what does not fit to *bad. */
static void check_fit(const struct kiln_model *m, const struct kiln_weights_in *in, int i,
		      const struct kiln_safetensors_tensor *t, struct names *bad)
{
	const struct model_param *p = &m->params[i];
	const int swap = transposed(m, in, i);
	const int fewer = (in->flags & KILN_WF_GPT2_NAMES) && kiln_gpt2_padded_rows(m, i);
	int same = t->ndim == p->desc.ndim;
	for (int d = 0; same && d < t->ndim; d++) {
		int64_t want = p->desc.dims[swap ? t->ndim - 1 - d : d];
		same = t->dims[d] == want || (fewer && d == 0 && t->dims[d] < want);
	}
	if (!same) {
		char a[160], b[160];
		int64_t dims[KILN_MAX_DIMS];
		for (int d = 0; d < p->desc.ndim; d++)
			dims[d] = p->desc.dims[swap ? p->desc.ndim - 1 - d : d];
		names_add(bad, "%s is %s in the file but %s%s in the model", t->name,
			  shape_str(t->ndim, t->dims, a, sizeof a),
			  swap ? "[in, out] = " : "", shape_str(p->desc.ndim, dims, b, sizeof b));
	} else if (!float_dtype(t)) {
		names_add(bad, "%s is %s (parameters load from F32, F16, BF16 or F64)", t->name,
			  t->dtype_name);
	}
}

/* Parameter i's values from the file's tensor j into host, in kiln's
 * layout: a Conv1D weight transposed, missing vocabulary rows 0.  tmp:
 * scratch of the parameter's size; raw: room for tensor j's bytes when
 * it is not F32. */
static kiln_status arrange(const struct kiln_model *m, const struct kiln_weights_in *in, int i,
			   int j, float *tmp, void *raw, float *host)
{
	const struct model_param *p = &m->params[i];
	const struct kiln_safetensors_tensor *t = &in->t[j];
	kiln_status st;
	if (transposed(m, in, i)) {
		const int64_t rows = p->desc.dims[0], cols = p->desc.dims[1];
		if ((st = read_f32(in, j, tmp, raw)))
			return st;
		for (int64_t r = 0; r < rows; r++)
			for (int64_t c = 0; c < cols; c++)
				host[r * cols + c] = tmp[c * rows + r];
		return KILN_OK;
	}
	if ((st = read_f32(in, j, host, raw)))
		return st;
	memset(host + t->numel, 0, sizeof(float) * (size_t)(p->numel - t->numel));
	return KILN_OK;
}

/* PyTorch's batch counter, tensor j: kept (the largest of the file's)
 * to be written back on export.  PyTorch writes an i64 scalar; an i32 one
 * is read too; any other dtype or shape, or a negative count, is ignored
 * with a warning naming it (kiln then writes the steps it counts). */
static kiln_status read_tracked(const struct kiln_weights_in *in, int j, int64_t *tracked)
{
	const struct kiln_safetensors_tensor *t = &in->t[j];
	int64_t v = -1;
	int32_t v32;
	kiln_status st = KILN_OK;
	if (t->numel == 1 && t->dtype == KILN_I64)
		st = in->read(in, j, &v);
	else if (t->numel == 1 && t->dtype == KILN_I32 && !(st = in->read(in, j, &v32)))
		v = v32;
	if (st)
		return st;
	if (v < 0) {
		char dims[96];
		if (t->numel == 1 && (t->dtype == KILN_I64 || t->dtype == KILN_I32))
			snprintf(dims, sizeof dims, "the count %lld", (long long)v);
		else
			snprintf(dims, sizeof dims, "%s%s, not an i64 scalar", t->dtype_name,
				 shape_str(t->ndim, t->dims, (char[64]){ 0 }, 64));
		kiln_log(KILN_LOG_WARN, "weights", "%s: tensor %s (%s) ignored: PyTorch writes an i64 scalar count; the count kiln writes back on export leaves it out",
			 in->path, t->name, dims);
		return KILN_OK;
	}
	if (v > *tracked)
		*tracked = v;
	return KILN_OK;
}

/* What the file holds beyond the model's parameters: a tied tensor's
 * second name (must equal the first), PyTorch's batch counter (into
 * *tracked), GPT-2's causal masks (skipped), else unexpected.  A status
 * for a read that failed. */
static kiln_status check_extra(const struct kiln_model *m, const struct kiln_weights_in *in,
			       const int *which, const char *used, int64_t *tracked,
			       struct names *bad, struct names *unexpected)
{
	kiln_status st;
	for (int j = 0; j < in->n; j++) {
		const struct kiln_safetensors_tensor *t = &in->t[j];
		if (used[j])
			continue;
		int tied = kiln_model_tie_alias(m, t->name), same;
		if (tied >= 0 && which[tied] >= 0) { /* both names of a tied tensor */
			if ((st = same_values(in, j, which[tied], &same)))
				return st;
			if (!same)
				names_add(bad, "%s differs from %s, the tensor it is tied to", t->name,
					  in->t[which[tied]].name);
			continue;
		}
		if (is_tracked_name(t->name)) {
			if ((st = read_tracked(in, j, tracked)))
				return st;
			continue;
		}
		if ((in->flags & KILN_WF_GPT2_NAMES) && kiln_gpt2_skipped(t->name))
			continue;
		names_add(unexpected, "%s", t->name);
	}
	return KILN_OK;
}

/* Copy the matched tensors to the device, one staging buffer (an F32
 * tensor read into it straight from the file, another through `raw`). */
static kiln_status copy_in(struct kiln_model *m, const struct kiln_weights_in *in,
			   const int *which, size_t most, int *loaded, void *stream)
{
	size_t most_raw = 1;
	for (int i = 0; i < m->n_params; i++)
		if (which[i] >= 0 && strcmp(in->t[which[i]].dtype_name, "F32") &&
		    in->t[which[i]].bytes > most_raw)
			most_raw = in->t[which[i]].bytes;
	float *host = NULL, *tmp = malloc(sizeof(float) * (most ? most : 1));
	void *raw = malloc(most_raw);
	kiln_status st = tmp && raw ? kiln_device_host_alloc(m->dev, (most ? most : 1) * sizeof(float),
							      (void **)&host)
				    : kiln_error(KILN_ENOMEM, "out of memory");
	for (int i = 0; !st && i < m->n_params; i++) {
		const struct model_param *p = &m->params[i];
		if (which[i] < 0)
			continue;
		/* (a stage's rank holding its slice alone: another stage's
		 * tensor is its rank's to load) */
		if (m->held && !p->buffer && (p->off < m->held_lo || p->off >= m->held_hi)) {
			(*loaded)++;
			continue;
		}
		if ((st = arrange(m, in, i, which[i], tmp, raw, host)) ||
		    (st = kiln_model_finite_check(m, in->path, p->buffer, p->off, host,
						  (size_t)p->numel)))
			break;
		float *dst = (p->buffer ? m->buffers_d : m->params_d) + p->off;
		kiln_model_weights_written(m);
		/* one staging buffer: wait for each copy before the next */
		if (!(st = kiln_device_copy_async(m->dev, dst, host, (size_t)p->numel * sizeof(float),
						  KILN_COPY_H2D, stream)) &&
		    !(st = kiln_device_stream_sync(m->dev, stream))) {
			(*loaded)++;
			m->params[i].given = 1; /* kiln_model_init_params keeps it */
		}
	}
	if (host)
		kiln_device_host_free(m->dev, host);
	free(tmp);
	free(raw);
	return st;
}

kiln_status kiln_weights_load(struct kiln_model *m, const struct kiln_weights_in *in, int strict,
			      void *stream)
{
	const char *path = in->path;
	int *which = malloc(sizeof(int) * (size_t)(m->n_params + 1)); /* file index or -1 */
	char *used = calloc((size_t)in->n + 1, 1);
	struct names missing = { "", 0 }, unexpected = { "", 0 }, bad = { "", 0 };
	int64_t tracked = -1;
	size_t most = 0;
	char m1[32], m2[32], m3[32];
	kiln_status st = KILN_OK;
	if (!which || !used) {
		st = kiln_error(KILN_ENOMEM, "out of memory");
		goto out;
	}
	for (int i = 0; i < m->n_params; i++) {
		which[i] = find_entry(m, in, i);
		if (which[i] < 0) {
			names_add(&missing, "%s", m->params[i].name);
			continue;
		}
		used[which[i]] = 1;
		check_fit(m, in, i, &in->t[which[i]], &bad);
		if ((size_t)m->params[i].numel > most)
			most = (size_t)m->params[i].numel;
	}
	if ((st = check_extra(m, in, which, used, &tracked, &bad, &unexpected)))
		goto out;
	if (bad.n) {
		st = kiln_error(KILN_ECONFIG, "%s: %d tensor(s) do not fit the model: %s%s", path, bad.n,
				bad.text, names_more(&bad, m1, sizeof m1));
		goto out;
	}
	if (strict && (missing.n || unexpected.n)) {
		char a[600] = "", b[600] = "";
		if (missing.n)
			snprintf(a, sizeof a, "; missing from the file: %s%s", missing.text,
				 names_more(&missing, m2, sizeof m2));
		if (unexpected.n)
			snprintf(b, sizeof b, "; not in the model: %s%s", unexpected.text,
				 names_more(&unexpected, m3, sizeof m3));
		st = kiln_error(KILN_ECONFIG,
				"%s does not match the model (init_strict = 1)%s%s; name kiln's layers like the PyTorch modules (docs/safetensors.md) or set [model] init_strict = 0 to load what matches",
				path, a, b);
		goto out;
	}
	int loaded = 0;
	if ((st = copy_in(m, in, which, most, &loaded, stream)))
		goto out;
	if (tracked >= 0)
		m->tracked_base = tracked;
	if (missing.n || unexpected.n) {
		char a[600] = "", b[600] = "";
		if (missing.n)
			snprintf(a, sizeof a, "; kept the initial values of %s%s", missing.text,
				 names_more(&missing, m2, sizeof m2));
		if (unexpected.n)
			snprintf(b, sizeof b, "; ignored what the model does not have: %s%s",
				 unexpected.text, names_more(&unexpected, m3, sizeof m3));
		kiln_log(KILN_LOG_WARN, "core", "%s: loaded %d of the model's %d parameters and buffers (init_strict = 0)%s%s",
			 path, loaded, m->n_params, a, b);
	} else {
		kiln_log(KILN_LOG_INFO, "core", "%s: loaded all %d parameters and buffers", path,
			 loaded);
	}
out:
	free(which);
	free(used);
	return st;
}

/* ---- the model a file of kiln's was exported from ------------------------ */

/* The width of the logits the loss layer reads, where its producer's
 * first parameter is a [classes, in] matrix (linear, a tied lm_head),
 * else 0: what [layer.loss] classes = 0 reads as. */
static int64_t logits_width(const struct kiln_model *m)
{
	const struct model_layer *loss = &m->layers[m->loss_layer];
	const int prod = loss->n_in ? loss->in[0] : -1;
	if (prod < 0 || !m->layers[prod].n_params)
		return 0;
	const struct model_param *p = &m->params[m->layers[prod].pidx[0]];
	return p->desc.ndim == 2 ? p->desc.dims[0] : 0;
}

/* The entry of [sec] key (sec_n bytes) in v[0..n), or NULL. */
static const struct kiln_kv *kv_find(const struct kiln_kv *v, int n, const char *sec, int sec_n,
				     const char *key)
{
	char s[160];
	snprintf(s, sizeof s, "%.*s", sec_n, sec);
	return kiln_kv_lookup(v, n, s, key);
}

static int kv_is(const struct kiln_kv *e, const char *val)
{
	return e && e->val && (size_t)e->val_n == strlen(val) && !memcmp(e->val, val, strlen(val));
}

/* Is [sec] a dropout layer in v, or absent from other: left out of the
 * comparison (identity at inference, so often left out of an inference
 * config).  Only its type and wiring are compared where both have it. */
static int dropout_only_here(const struct kiln_kv *v, int n, const struct kiln_kv *other,
			     int nother, const struct kiln_kv *e)
{
	return kv_is(kv_find(v, n, e->sec, e->sec_n, "type"), "dropout") &&
	       !kv_find(other, nother, e->sec, e->sec_n, "type");
}

/* Keys no inference result reads (training alone: trainable, batchnorm's
 * momentum, the loss's label_smoothing and ignore_index), besides those
 * the weights comparison leaves out (core/resume.c weightless_keys:
 * dropout's rate, inplace, recompute, ...). */
static int inference_blind(const char *key)
{
	static const char *const keys[] = { "trainable", "momentum", "label_smoothing",
					    "ignore_index" };
	for (size_t i = 0; i < KILN_ARRAY_LEN(keys); i++)
		if (!strcmp(key, keys[i]))
			return 1;
	return 0;
}

/* Has [sec] key (e's section) been reported already (skip: "sec key\n"
 * lines)? */
static int reported(const char *skip, const struct kiln_kv *e)
{
	char line[300];
	snprintf(line, sizeof line, "%.*s %.*s\n", e->sec_n, e->sec, e->key_n, e->key);
	return skip && strstr(skip, line) && (strstr(skip, line) == skip || strstr(skip, line)[-1] == '\n');
}

/* The [layer.*] text v as inference reads it, beside the other side's:
 * the sections and keys no inference result reads left out (above), a
 * dropout layer the other side lacks dropped and what reads it wired to
 * its input, each computed default where the other side sets the key
 * written as its value: an unset input is the layer before, classes = 0
 * the logits' width (width), an unset bias (on either side) left to the
 * tensor comparison, which ran first.  malloc'd; NULL on KILN_ENOMEM. */
static char *inference_text(const struct kiln_kv *v, int n, const struct kiln_kv *o, int no,
			    int64_t width, const char *skip)
{
	char *text = NULL, prev[160] = "", sec[160] = "";
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);
	if (!f)
		return NULL;
	for (int i = 0; i < n; i++) {
		const struct kiln_kv *e = &v[i];
		char key[128], val[300];
		snprintf(key, sizeof key, "%.*s", e->key_n, e->key);
		const int dropped = dropout_only_here(v, n, o, no, e);
		const int dropout = kv_is(kv_find(v, n, e->sec, e->sec_n, "type"), "dropout");
		if (strncmp(sec, e->sec, (size_t)e->sec_n) || sec[e->sec_n]) {
			/* the layer before this one (a dropped one's before it) */
			const struct kiln_kv *t = *sec ? kv_find(v, n, sec, (int)strlen(sec), "type") : NULL;
			if (t && !dropout_only_here(v, n, o, no, t))
				snprintf(prev, sizeof prev, "%s", sec + 6);
			snprintf(sec, sizeof sec, "%.*s", e->sec_n, e->sec);
			if (!dropped)
				fprintf(f, "[%s]\n", sec);
		}
		if (dropped || reported(skip, e) || inference_blind(key) ||
		    (dropout && strcmp(key, "type") && strcmp(key, "input") && strcmp(key, "inputs")))
			continue;
		const struct kiln_kv *theirs = kv_find(o, no, e->sec, e->sec_n, key);
		if (!strcmp(key, "bias") && (!e->val || (theirs && !theirs->val)))
			continue;
		if (e->val)
			snprintf(val, sizeof val, "%.*s", e->val_n, e->val);
		if (!strcmp(key, "classes") && width > 0 && kv_is(e, "0"))
			snprintf(val, sizeof val, "%lld", (long long)width);
		const struct kiln_kv *many = kv_find(v, n, e->sec, e->sec_n, "inputs");
		if (!strcmp(key, "input") && !e->val && *prev && !(many && many->val))
			snprintf(val, sizeof val, "%s", prev);
		else if (!e->val) {
			fprintf(f, "; %s = (unset)\n", key);
			continue;
		}
		fprintf(f, "%s = %s\n", key, val);
	}
	return fclose(f) ? (free(text), NULL) : text;
}
/* At most this many keys that differ are named, then "and N more". */
#define DIFFS_SHOWN 8

/* The keys of the [layer.*] sections a file records (`recorded`: an
 * export's kiln.layers, a checkpoint's config) that differ from the
 * model m's by meaning, as inference reads them (inference_text;
 * compared as a checkpoint's weights keys are: kiln_ckpt_config_delta),
 * each warned of on a line of its own after one saying the file (path)
 * `whence`.  A key the text lacks that is unset in its layer type's
 * schema reads as unset (kiln_config_layers_of: kiln.layers leaves them
 * out since session 42). */
static kiln_status warn_layers(const struct kiln_model *m, const char *path, const char *recorded,
			       const char *whence)
{
	char *current = layers_text(m->cfg, KILN_LAYERS_CANON);
	char *defaults = current ? layers_text(m->cfg, KILN_LAYERS_DEFAULTS) : NULL;
	char *saved = defaults ? kiln_config_layers_of(m->cfg, recorded) : NULL;
	char *skip = NULL, *a = NULL, *b = NULL;
	size_t skip_len = 0;
	struct kiln_kv *sv = NULL, *cv = NULL;
	int ns = 0, nc = 0, shown = 0, differs = 1;
	FILE *sk = saved ? open_memstream(&skip, &skip_len) : NULL;
	kiln_status st = sk ? KILN_OK : KILN_ENOMEM;
	if (!st && !(st = kiln_kv_parse(saved, &sv, &ns)))
		st = kiln_kv_parse(current, &cv, &nc);
	const int64_t width = logits_width(m);
	/* one key at a time: each found is left out of the next comparison */
	while (!st && differs) {
		struct kiln_config_delta d;
		fflush(sk);
		free(a);
		free(b);
		a = inference_text(sv, ns, cv, nc, width, skip);
		b = a ? inference_text(cv, nc, sv, ns, width, skip) : NULL;
		if (!b)
			st = KILN_ENOMEM;
		else
			st = kiln_ckpt_config_delta(a, b, "", defaults, m->cfg, &differs, &d);
		if (st || !differs)
			break;
		if (!shown)
			kiln_log(KILN_LOG_WARN, "core", "%s %s: its weights loaded, but may compute another function here (an attention head count, an activation or a norm's eps keeps every shape); the keys that differ:",
				 path, whence);
		if (shown < DIFFS_SHOWN)
			kiln_log(KILN_LOG_WARN, "core", "%s: [%s] %s is %s in the file but %s here", path,
				 d.section, d.key, d.a, d.b);
		shown++;
		fprintf(sk, "%s %s\n", d.section, d.key);
	}
	if (!st && shown > DIFFS_SHOWN)
		kiln_log(KILN_LOG_WARN, "core", "%s: and %d more", path, shown - DIFFS_SHOWN);
	if (st == KILN_ENOMEM)
		kiln_error(KILN_ENOMEM, "out of memory");
	if (sk)
		fclose(sk);
	free(skip);
	free(a);
	free(b);
	free(sv);
	free(cv);
	free(saved);
	free(current);
	free(defaults);
	return st;
}

/* The [layer.*] sections the file f (named path) records against the
 * model m's, after its tensors loaded (a shape that differs was the
 * clearer error): the same shapes may compute another function
 * (attention heads, an activation, a norm's eps), which no tensor shows.
 * kiln.layers (kiln export since session 41): each key that differs is
 * warned of (warn_layers), never refused: many keys change nothing an
 * inference computes.  config_hash alone (a kiln before session 41): a
 * hash that differs is warned of (it covers every key, those that change
 * nothing at inference too, and kilns before session 36 hashed the
 * text's bytes: it cannot tell which key, nor whether it matters).
 * Neither (PyTorch's files, the GPT-2 release's): nothing to check. */
static kiln_status check_exported(const struct kiln_model *m, const struct kiln_safetensors *f,
				  const char *path)
{
	const char *saved = kiln_safetensors_meta(f, "kiln.layers");
	const char *hash = kiln_safetensors_meta(f, "config_hash");
	if (saved)
		return warn_layers(m, path, saved,
				   "was exported from another model (metadata kiln.layers records its [layer.*] sections)");
	if (!hash)
		return KILN_OK;
	char ours[17], *current = layers_text(m->cfg, KILN_LAYERS_CANON);
	if (!current)
		return KILN_ENOMEM;
	config_hash(current, ours);
	if (strcmp(hash, ours))
		kiln_log(KILN_LOG_WARN, "core", "%s: its config_hash %s is not this config's %s: the [layer.*] sections it was exported from differ from these (or were hashed by a kiln before session 36); where a key that changes what the weights compute differs (attention heads, an activation, a norm's eps), they compute another function here.  A kiln before session 41 wrote it, which did not record the sections: export it again to have them checked",
			 path, hash, ours);
	free(current);
	return KILN_OK;
}

/* The KILN_WF_* flags of a file format. */
static int format_flags(int format)
{
	return format == KILN_WEIGHTS_GPT2 ? KILN_WF_GPT2_NAMES | KILN_WF_CONV1D : 0;
}

/* kiln_weights_in.read of a safetensors file (ctx: its reader): pread
 * into dst, no mapping touched. */
static kiln_status st_read(const struct kiln_weights_in *in, int j, void *dst)
{
	return kiln_safetensors_read(in->ctx, j, dst, in->t[j].bytes);
}

/* The weights of the open safetensors file f (named path) into m: its
 * CRC32Cs checked where it has them (kiln's since session 41: a byte
 * changed since kiln wrote it is refused, naming the tensor; another
 * writer's file, or an older kiln's, loads unchecked), the header's
 * first, each tensor's as it is read (kiln_safetensors_crc_reads), before
 * its values are used: one pass over the bytes a rank loads (before
 * session 42 a check read the whole file first, then the load read it
 * again, and a pipeline stage's rank checked every stage's tensors). */
static kiln_status load_safetensors(struct kiln_model *m, struct kiln_safetensors *f,
				    const char *path, int format, int strict, void *stream)
{
	int had;
	kiln_status st = kiln_safetensors_crc_reads(f, KILN_ST_CRC_KEY, &had);
	if (st)
		return st;
	int n = kiln_safetensors_count(f);
	struct kiln_safetensors_tensor *t = calloc((size_t)n + 1, sizeof *t);
	if (!t)
		return kiln_error(KILN_ENOMEM, "out of memory");
	for (int j = 0; j < n; j++)
		kiln_safetensors_describe(f, j, &t[j]);
	struct kiln_weights_in in = { path, n, t, format_flags(format), st_read, f };
	st = kiln_weights_load(m, &in, strict, stream);
	free(t);
	return st;
}

kiln_status kiln_model_load_safetensors_as(struct kiln_model *m, const char *path, int format,
					   int strict, void *stream)
{
	struct kiln_safetensors *f;
	kiln_status st = kiln_safetensors_open(path, &f);
	if (st)
		return st;
	st = load_safetensors(m, f, path, format, strict, stream);
	kiln_safetensors_close(f);
	return st;
}

kiln_status kiln_model_load_safetensors(struct kiln_model *m, const char *path, int strict,
					void *stream)
{
	return kiln_model_load_safetensors_as(m, path, KILN_WEIGHTS_PYTORCH, strict, stream);
}

/* The [layer.*] sections of the config checkpoint ck was trained with
 * against the model m's once its weights loaded, as an export's
 * (warn_layers: a key that differs is warned of, never refused; before
 * session 42 a checkpoint's were never compared, and one trained with 2
 * attention heads loaded into 4 without a word).  A checkpoint without
 * its config: nothing to compare. */
static kiln_status check_trained(const struct kiln_model *m, struct kiln_ckpt *ck,
				 const char *path)
{
	char *config = NULL;
	if (kiln_ckpt_read_text(ck, "config", &config))
		return KILN_OK;
	kiln_status st = warn_layers(m, path, config,
				     "was trained with another model (its config records its [layer.*] sections)");
	free(config);
	return st;
}

/* [model] init_from names a kiln checkpoint, open on fd: its weights alone
 * (params and buffers), for a new run with its own optimizer and
 * schedule; its model's [layer.*] sections compared with m's
 * (check_trained). */
static kiln_status init_from_checkpoint(struct kiln_model *m, const char *path, int fd,
					void *stream)
{
	struct kiln_ckpt *ck;
	kiln_status st = kiln_ckpt_open_fd(path, fd, &ck);
	/* (a stage's rank holding its slice alone: that slice and the
	 * buffers, session 12) */
	if (!st && m->held)
		st = kiln_ckpt_load_stage(ck, m, stream, m->held_lo, m->held_hi, NULL,
					  KILN_CKPT_LOAD_WEIGHTS);
	else if (!st)
		st = kiln_ckpt_load_model(ck, m, stream, KILN_CKPT_LOAD_WEIGHTS);
	if (!st) {
		/* every parameter and buffer: kiln_model_init_params draws none */
		for (int i = 0; i < m->n_params; i++)
			m->params[i].given = 1;
		kiln_log(KILN_LOG_INFO, "core", "%s: loaded the weights of step %lld (weights only: optimizer state, step counts and schedule start anew)%s",
			 path, (long long)kiln_ckpt_step(ck),
			 m->held ? "; this rank's stage's parameters alone" : "");
		st = check_trained(m, ck, path);
	}
	kiln_ckpt_close(ck);
	return st;
}

int kiln_weights_kind_fd(int fd)
{
	return kiln_ckpt_is_checkpoint_fd(fd) ? KILN_WEIGHTS_IS_CHECKPOINT
	       : kiln_llmc_is_model_fd(fd)    ? KILN_WEIGHTS_IS_LLMC
					      : KILN_WEIGHTS_IS_SAFETENSORS;
}

kiln_status kiln_weights_open_fd(int fd, const char *path, struct kiln_weights_file *out)
{
	out->fd = fd;
	out->path = path;
	kiln_status st = kiln_file_seen_fd(fd, path, &out->seen);
	/* (told after the fstat: a rewrite since is seen by the reads) */
	out->kind = kiln_weights_kind_fd(fd);
	return st;
}

kiln_status kiln_weights_load_fd(struct kiln_model *m, const struct kiln_weights_file *w,
				 int named, int *told, void *stream)
{
	int strict = 1;
	const char *format = kiln_config_get(m->cfg, "model", "init_format");
	kiln_config_get_bool(m->cfg, "model", "init_strict", &strict);
	/* a checkpoint's and llm.c's file by their magic */
	*told = w->kind != KILN_WEIGHTS_IS_SAFETENSORS;
	if (w->kind == KILN_WEIGHTS_IS_CHECKPOINT)
		return init_from_checkpoint(m, w->path, w->fd, stream);
	if (w->kind == KILN_WEIGHTS_IS_LLMC)
		return kiln_llmc_load_fd(m, w->path, w->fd, &w->seen, strict, stream);
	struct kiln_safetensors *f;
	kiln_status st = kiln_safetensors_open_fd(w->path, w->fd, &w->seen, &f);
	if (st)
		return st;
	*told = 1; /* a safetensors file: its header parsed */
	/* its I8 weights would be refused one by one, naming no cause */
	if (kiln_quant_is_model(f))
		st = kiln_error(KILN_EUSAGE, "%s is an INT8 model of `kiln quantize` (metadata kiln.format = kiln-int8/1), not a checkpoint or weights file: pass it with --quantized (kiln eval, predict, export --onnx; the C API: kiln_infer_opts.quantized), and to kiln quantize the fp32 checkpoint it was made from",
				w->path);
	/* the tensors' shapes first: a key that shapes them (an fc's out) is
	 * their clearer error; then the keys that keep every shape */
	else if (!(st = load_safetensors(m, f, w->path, kiln_weights_format(format), strict, stream)))
		st = check_exported(m, f, w->path);
	kiln_safetensors_close(f);
	return st;
}

/* The weights file `path` into m, opened once: its kind is told and its
 * tensors read through that one descriptor, so a file removed or replaced
 * meanwhile is not read in part (before session 38 it was opened three
 * times, and a file removed after the first open was "cannot open", exit 1,
 * not "no such file", exit 2).  *missing: 1 when nothing is at path (the
 * status is then KILN_EIO with no message set: the caller says it). */
static kiln_status load_weights_file(struct kiln_model *m, const char *path, void *stream,
				     int *missing)
{
	char kind[64];
	const char *why;
	struct kiln_weights_file w;
	int fd = common_open_file(path, kind, sizeof kind, &why, NULL);
	*missing = fd < 0 && (errno == ENOENT || errno == ENOTDIR);
	if (*missing)
		return KILN_EIO;
	if (fd < 0)
		return kiln_error(KILN_EIO, "%s: cannot open: %s", path, why);
	int told;
	kiln_status st = kiln_weights_open_fd(fd, path, &w);
	if (!st)
		st = kiln_weights_load_fd(m, &w, 0, &told, stream);
	close(fd);
	return st;
}

kiln_status kiln_model_init_from(struct kiln_model *m, void *stream)
{
	const char *path = kiln_config_get(m->cfg, "model", "init_from");
	int missing;
	if (!path || !*path)
		return KILN_OK;
	struct stat sb;
	if (!stat(path, &sb) && S_ISDIR(sb.st_mode)) /* exit 1, "cannot open", before session 50 */
		return kiln_error(KILN_ECONFIG, "%s: [model] init_from: %s: a directory, not a weights file (a checkpoint such as RUN_DIR/checkpoints/ckpt-<step>.kiln, or a safetensors file)",
				  kiln_config_where(m->cfg, "model", "init_from"), path);
	kiln_status st = load_weights_file(m, path, stream, &missing);
	/* a file that is not there: a config error at its line (exit 2), as a
	 * missing --checkpoint is a usage error (README.md, "Exit codes"); exit
	 * 1 before session 36.  One that is there but unreadable: KILN_EIO. */
	if (missing)
		return kiln_error(KILN_ECONFIG, "%s: [model] init_from: %s: no such file",
				  kiln_config_where(m->cfg, "model", "init_from"), path);
	if (st)
		return kiln_error_wrap(st, "%s: [model] init_from",
				       kiln_config_where(m->cfg, "model", "init_from"));
	return KILN_OK;
}

int kiln_weights_format(const char *name)
{
	if (!name || !strcmp(name, "pytorch"))
		return KILN_WEIGHTS_PYTORCH;
	if (!strcmp(name, "gpt2"))
		return KILN_WEIGHTS_GPT2;
	return -1;
}
