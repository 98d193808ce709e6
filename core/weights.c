/* core/weights.c - the model's parameters and buffers to and from
 * safetensors files (docs/safetensors.md): kiln_model_save_safetensors and
 * `kiln export`, kiln_model_load_safetensors and [model] init_from.
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
 */
#include "checkpoint.h"
#include "graph.h"
#include "data.h"
#include "run_config.h"

#include <stdarg.h>
#include <stdio.h>

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

/* FNV-1a 64 of the resolved [layer.*] sections: equal for configs that
 * build the same model. */
static void config_hash(const struct kiln_model *m, char out[17])
{
	char *text = NULL;
	size_t len = 0;
	uint64_t h = 0xcbf29ce484222325ull;
	FILE *f = open_memstream(&text, &len);
	if (f) {
		kiln_config_write_layers(m->cfg, f);
		fclose(f);
	}
	for (size_t i = 0; text && i < len; i++)
		h = (h ^ (unsigned char)text[i]) * 0x100000001b3ull;
	free(text);
	snprintf(out, 17, "%016llx", (unsigned long long)h);
}

kiln_status kiln_model_save_safetensors(struct kiln_model *m, const char *path, void *stream)
{
	const size_t np = m->n_elems, nb = m->n_buf_elems;
	float *host = NULL;
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
	if ((st = kiln_safetensors_writer_new(&w)))
		goto out;
	for (int i = 0; i < m->n_params; i++) {
		const struct model_param *p = &m->params[i];
		if ((st = kiln_safetensors_writer_add(w, p->name, KILN_F32, p->desc.ndim, p->desc.dims,
						      (p->buffer ? host + np : host) + p->off)))
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
	config_hash(m, hash);
	if ((st = kiln_safetensors_writer_meta(w, "format", "pt")) ||
	    (st = kiln_safetensors_writer_meta(w, "kiln_version", kiln_version())) ||
	    (st = kiln_safetensors_writer_meta(w, "config_hash", hash)))
		goto out;
	st = kiln_safetensors_writer_write(w, path);
out:
	kiln_safetensors_writer_free(w);
	kiln_device_host_free(m->dev, host);
	return st;
}

/* ---- load ----------------------------------------------------------------- */

/* IEEE half to float, subnormals, infinities and NaNs included. */
static float half_to_float(uint16_t h)
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

/* The tensor's elements as f32 into dst; -1 for a dtype that is not a float. */
static int to_f32(float *dst, const struct kiln_safetensors_tensor *t)
{
	const unsigned char *s = t->data;
	if (!strcmp(t->dtype_name, "F32")) {
		memcpy(dst, s, t->bytes);
		return 0;
	}
	for (int64_t i = 0; i < t->numel; i++) {
		if (!strcmp(t->dtype_name, "F16") || !strcmp(t->dtype_name, "BF16")) {
			uint16_t v;
			memcpy(&v, s + 2 * i, 2);
			if (t->dtype_name[0] == 'F') {
				dst[i] = half_to_float(v);
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

/* The file's entry for parameter i: its name, else (a tied tensor) an
 * alias of it ("lm_head.weight" of [layer.lm_head] tie = wte); -1 when
 * the file has neither. */
static int find_entry(const struct kiln_model *m, const struct kiln_safetensors *f, int i)
{
	int alias = -1;
	for (int j = 0; j < kiln_safetensors_count(f); j++) {
		struct kiln_safetensors_tensor t;
		kiln_safetensors_get(f, j, &t);
		if (!strcmp(t.name, m->params[i].name))
			return j;
		if (alias < 0 && kiln_model_tie_alias(m, t.name) == i)
			alias = j;
	}
	return alias;
}

/* Do two tensors hold the same shape and the same values, as f32?  (A
 * tied tensor's two names in one file must.) */
static int same_values(const struct kiln_safetensors_tensor *a,
		       const struct kiln_safetensors_tensor *b)
{
	int same = a->ndim == b->ndim && a->numel == b->numel;
	for (int d = 0; same && d < a->ndim; d++)
		same = a->dims[d] == b->dims[d];
	if (!same)
		return 0;
	float *x = malloc(sizeof(float) * (size_t)(a->numel + 1));
	float *y = malloc(sizeof(float) * (size_t)(b->numel + 1));
	same = x && y && !to_f32(x, a) && !to_f32(y, b) &&
	       !memcmp(x, y, sizeof(float) * (size_t)a->numel);
	free(x);
	free(y);
	return same;
}

kiln_status kiln_model_load_safetensors(struct kiln_model *m, const char *path, int strict,
					void *stream)
{
	struct kiln_safetensors *f;
	kiln_status st = kiln_safetensors_open(path, &f);
	if (st)
		return st;
	int nf = kiln_safetensors_count(f);
	int *which = malloc(sizeof(int) * (size_t)(m->n_params + 1)); /* file index or -1 */
	char *used = calloc((size_t)nf + 1, 1);
	float *host = NULL;
	struct names missing = { "", 0 }, unexpected = { "", 0 }, bad = { "", 0 };
	int64_t tracked = -1;
	size_t most = 0;
	char m1[32], m2[32], m3[32];
	if (!which || !used) {
		st = kiln_error(KILN_ENOMEM, "out of memory");
		goto out;
	}
	for (int i = 0; i < m->n_params; i++) {
		const struct model_param *p = &m->params[i];
		struct kiln_safetensors_tensor t;
		which[i] = find_entry(m, f, i);
		if (which[i] < 0) {
			names_add(&missing, "%s", p->name);
			continue;
		}
		kiln_safetensors_get(f, which[i], &t);
		used[which[i]] = 1;
		int same = t.ndim == p->desc.ndim;
		for (int d = 0; same && d < t.ndim; d++)
			same = t.dims[d] == p->desc.dims[d];
		if (!same) {
			char a[160], b[160];
			names_add(&bad, "%s is %s in the file but %s in the model", t.name,
				  shape_str(t.ndim, t.dims, a, sizeof a),
				  shape_str(p->desc.ndim, p->desc.dims, b, sizeof b));
		} else if (strcmp(t.dtype_name, "F32") && strcmp(t.dtype_name, "F16") &&
			   strcmp(t.dtype_name, "BF16") && strcmp(t.dtype_name, "F64")) {
			names_add(&bad, "%s is %s (parameters load from F32, F16, BF16 or F64)",
				  t.name, t.dtype_name);
		}
		if ((size_t)p->numel > most)
			most = (size_t)p->numel;
	}
	for (int j = 0; j < nf; j++) {
		struct kiln_safetensors_tensor t;
		kiln_safetensors_get(f, j, &t);
		if (used[j])
			continue;
		int tied = kiln_model_tie_alias(m, t.name);
		if (tied >= 0 && which[tied] >= 0) { /* both names of a tied tensor */
			struct kiln_safetensors_tensor o;
			kiln_safetensors_get(f, which[tied], &o);
			if (!same_values(&t, &o))
				names_add(&bad, "%s differs from %s, the tensor it is tied to", t.name,
					  o.name);
			continue;
		}
		if (is_tracked_name(t.name)) {
			/* PyTorch's batch counter: kept to be written back on export */
			int64_t v;
			if (t.dtype == KILN_I64 && t.numel == 1) {
				memcpy(&v, t.data, sizeof v);
				if (v > tracked)
					tracked = v;
			}
			continue;
		}
		names_add(&unexpected, "%s", t.name);
	}
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
	if ((st = kiln_device_host_alloc(m->dev, (most ? most : 1) * sizeof(float), (void **)&host)))
		goto out;
	int loaded = 0;
	for (int i = 0; i < m->n_params; i++) {
		const struct model_param *p = &m->params[i];
		struct kiln_safetensors_tensor t;
		if (which[i] < 0)
			continue;
		kiln_safetensors_get(f, which[i], &t);
		to_f32(host, &t);
		float *dst = (p->buffer ? m->buffers_d : m->params_d) + p->off;
		m->pcopy_stale = 1;
		/* one staging buffer: wait for each copy before the next */
		if ((st = kiln_device_copy_async(m->dev, dst, host, (size_t)p->numel * sizeof(float),
						 KILN_COPY_H2D, stream)) ||
		    (st = kiln_device_stream_sync(m->dev, stream)))
			goto out;
		loaded++;
	}
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
	kiln_device_host_free(m->dev, host);
	free(which);
	free(used);
	kiln_safetensors_close(f);
	return st;
}

/* [model] init_from names a kiln checkpoint: its weights alone (params
 * and buffers), for a new run with its own optimizer and schedule. */
static kiln_status init_from_checkpoint(struct kiln_model *m, const char *path, void *stream)
{
	struct kiln_ckpt *ck;
	kiln_status st = kiln_ckpt_open(path, &ck);
	if (!st)
		st = kiln_ckpt_load_model(ck, m, stream, KILN_CKPT_LOAD_WEIGHTS);
	if (!st)
		kiln_log(KILN_LOG_INFO, "core", "%s: loaded the weights of step %lld (weights only: optimizer state, step counts and schedule start anew)",
			 path, (long long)kiln_ckpt_step(ck));
	kiln_ckpt_close(ck);
	return st;
}

kiln_status kiln_model_init_from(struct kiln_model *m, void *stream)
{
	const char *path = kiln_config_get(m->cfg, "model", "init_from");
	int strict = 1;
	kiln_status st;
	if (!path || !*path)
		return KILN_OK;
	kiln_config_get_bool(m->cfg, "model", "init_strict", &strict);
	if (kiln_ckpt_is_checkpoint(path))
		st = init_from_checkpoint(m, path, stream);
	else
		st = kiln_model_load_safetensors(m, path, strict, stream);
	if (st)
		return kiln_error_wrap(st, "%s: [model] init_from",
				       kiln_config_where(m->cfg, "model", "init_from"));
	return KILN_OK;
}

/* ---- `kiln export` ---------------------------------------------------------- */

kiln_status kiln_export_safetensors(const struct kiln_config *cfg,
				    const struct kiln_registry *reg, const char *checkpoint,
				    const char *path)
{
	struct kiln_device *dev = NULL;
	struct kiln_model *m = NULL;
	struct kiln_dataset ds;
	void *stream = NULL;
	struct kiln_run_cfg run;
	struct kiln_ckpt *ck = NULL;
	char dir[4200];
	kiln_status st;
	if ((st = kiln_run_cfg_read(cfg, &run)))
		return st;
	/* a checkpoint is verified whole before the model is even built */
	if ((st = kiln_ckpt_open_weights(cfg, reg, checkpoint, &ck, dir, sizeof dir)))
		return st;
	const char *init = kiln_config_get(cfg, "model", "init_from");
	if (ck)
		kiln_log(KILN_LOG_INFO, "core", "exporting the weights of %s (step %lld)",
			 kiln_ckpt_path(ck), (long long)kiln_ckpt_step(ck));
	else
		kiln_log(KILN_LOG_WARN, "core", "%s%s: exporting the initial weights ([run] seed%s), not trained ones (give --checkpoint CKPT, or train first)",
			 *dir ? "no checkpoint in " : "[run] out_dir is empty", dir,
			 init && *init ? ", then [model] init_from" : "");
	if ((st = kiln_device_open(reg, cfg, run.device, 0, &dev))) {
		kiln_ckpt_close(ck);
		return st;
	}
	/* the sample, as the model sees it (u8 samples become f32, token ids
	 * stay i32) */
	memset(&ds, 0, sizeof ds);
	if ((st = kiln_dataset_open(cfg, reg, "data", "train", 1, &ds)))
		goto out;
	struct kiln_tensor_desc sample;
	kiln_dataset_input_desc(&ds, &sample);
	kiln_dataset_close(&ds);
	if ((st = kiln_model_create(cfg, reg, dev, &sample, &m)) ||
	    (st = kiln_device_stream_create(dev, &stream)) ||
	    (st = kiln_model_init_params(m, (uint64_t)run.seed, stream)) ||
	    /* a checkpoint replaces every weight: init_from is not read */
	    (!ck && (st = kiln_model_init_from(m, stream))) ||
	    (ck && (st = kiln_ckpt_load_model(ck, m, stream, KILN_CKPT_LOAD_WEIGHTS))) ||
	    (st = kiln_model_save_safetensors(m, path, stream)))
		goto out;
	kiln_log(KILN_LOG_DEBUG, "core", "wrote %d parameters and buffers to %s",
		 kiln_model_param_count(m), path);
out:
	if (stream)
		kiln_device_stream_sync(dev, stream);
	kiln_model_free(m);
	if (stream)
		kiln_device_stream_destroy(dev, stream);
	kiln_device_close(dev);
	kiln_ckpt_close(ck);
	return st;
}
