/* core/infer.c - the inference API (include/kiln/infer.h): a trained model
 * (core/trained.c's kiln_trained_open: device, model, weights) with an
 * inference plan (kiln_plan_opts.logits: the evaluation forward without
 * the loss layer, the logits kept), run on host buffers batch by batch
 * under the model's lock; and the [data.eval] image transforms for
 * decoded images.  `kiln predict` (cli/cmd_predict.c) is built on it. */
#include "graph.h"
#include "checkpoint.h"
#include "data.h"
#include "infer_passes.h"
#include "quant.h"

#include <kiln/infer.h>

#include <pthread.h>
#ifdef __GLIBC__
#include <malloc.h> /* malloc_trim */
#endif
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>   /* sysconf */

#define INFER_BATCH 64

struct kiln_infer {
	pthread_mutex_t lock;
	struct kiln_config *own_cfg;     /* kiln_model_load's, else NULL */
	struct kiln_registry *own_reg;
	struct kiln_config *cfg;         /* own_cfg, copy or the caller's */
	struct kiln_config *copy;        /* kiln_infer_open's copy of the caller's, or NULL */
	const struct kiln_registry *reg;
	struct kiln_trained t;           /* device, model, stream, sample */
	int64_t batch;
	int64_t run;                     /* rows of one plan run: batch, or its cache block */
	int prepared;
	int no_fold;                     /* kiln_infer_opts.no_fold */
	int no_residual;                 /* kiln_infer_opts.no_residual */
	char *quantized;                 /* kiln_infer_opts.quantized, or NULL */
	struct kiln_safetensors *qf;     /* it, open from kiln_infer_open to infer_fold */
	struct kiln_config *fcfg;        /* the folded model's config, or NULL */
	struct kiln_tensor_desc out;     /* one sample's logits */
	size_t in_bytes, out_elems;
	struct kiln_plan *p;             /* batch rows */
	struct kiln_plan *rem;           /* rem_rows rows (a last partial batch), or NULL */
	int64_t rem_rows;
	void *x_d;                       /* device input, batch samples */
	int lo_dtype;                    /* the logits' dtype on the device ([run] precision) */
	uint16_t *lo_h;                  /* bf16/f16 logits on the host, batch rows; else NULL */
	/* kiln_infer_image: [data.eval]'s transforms, read on first use */
	int have_xf;
	struct kiln_xform xf;
	int32_t src_h, src_w, src_c;     /* the images the model was fed (0: any) */
	int bf16;                        /* [data.eval] dtype = bf16: samples rounded to it */
	struct kiln_xform_scratch xs;
};

kiln_status kiln_infer_open(struct kiln_config *cfg, const struct kiln_registry *reg,
			    const char *weights, const struct kiln_infer_opts *opts,
			    struct kiln_infer **out)
{
	kiln_status st;
	if (!cfg || !out)
		return kiln_error(KILN_EINVAL, "kiln_infer_open: %s is NULL", !cfg ? "cfg" : "out");
	*out = NULL;
	if (opts && opts->batch < 0)
		return kiln_error(KILN_EINVAL, "kiln_infer_opts.batch = %lld: a row count, or 0 for %d",
				  (long long)opts->batch, INFER_BATCH);
	/* "" named no file (": cannot open: No such file or directory"
	 * before session 39) */
	if (weights && !*weights)
		return kiln_error(KILN_EUSAGE, "the weights path is empty: a checkpoint or weights file, or NULL for the newest checkpoint in [run] out_dir");
	if (opts && opts->quantized && !*opts->quantized)
		return kiln_error(KILN_EUSAGE, "kiln_infer_opts.quantized is empty: an INT8 model of `kiln quantize`, or NULL for none");
	struct kiln_infer *m = calloc(1, sizeof *m);
	if (!m)
		return kiln_error(KILN_ENOMEM, "out of memory");
	pthread_mutex_init(&m->lock, NULL);
	m->cfg = cfg;
	m->reg = reg;
	m->batch = opts && opts->batch ? opts->batch : INFER_BATCH;
	m->no_fold = opts && opts->no_fold;
	m->no_residual = opts && opts->no_residual;
	st = kiln_quant_no_weights(opts ? opts->quantized : NULL, weights);
	if (!st && opts && opts->quantized)
		st = kiln_quant_need_fp32(cfg, "an INT8 model computes in fp32");
	/* an INT8 model is the folded model: there is no unfolded one to run
	 * (before session 31 no_fold was ignored silently) */
	if (!st && m->no_fold && opts->quantized)
		st = kiln_error(KILN_EUSAGE, "%s: kiln_infer_opts.no_fold with a quantized model: an INT8 model is the folded model (kiln quantize folds it before quantizing) and has no unfolded form; leave no_fold 0",
				opts->quantized);
	if (!st && opts && opts->quantized && !(m->quantized = strdup(opts->quantized)))
		st = kiln_error(KILN_ENOMEM, "out of memory");
	/* the CPU's fastest convolution kernels, timed once per shape when the
	 * plan is prepared, unless the config chose ([plugin.cpu] conv_impl):
	 * set in a copy, as the caller's config is read-only once validated and
	 * may be read by other threads (config.h; before session 35 this call
	 * wrote it, even when it failed) */
	if (!st && !kiln_config_get(cfg, "plugin.cpu", "conv_impl") &&
	    !(st = kiln_config_dup(cfg, &m->copy))) {
		m->cfg = m->copy;
		st = kiln_config_override(m->cfg, "plugin.cpu.conv_impl=auto");
	}
	/* a quantized model: the config's model's shape, its input sample the
	 * file's (else [data]'s: a file of a kiln before session 39), its
	 * weights the file's, opened once (here, read by infer_fold); with no
	 * checkpoint, init_from or the seeded initial weights, with a
	 * warning, as `kiln export` takes them (docs/inference.md) */
	if (!st && m->quantized)
		st = kiln_quant_open(m->quantized, &m->qf);
	const struct kiln_given q = { .file.fd = -1, .qf = m->qf };
	if (st ||
	    (st = m->qf ? kiln_trained_open_given(m->cfg, reg, &q, "predicting with", -1, &m->t)
			: kiln_trained_open(m->cfg, reg, weights, "predicting with", 0, &m->t)) ||
	    (st = kiln_infer_prepare(m))) {
		kiln_infer_free(m);
		return st;
	}
	*out = m;
	return KILN_OK;
}

kiln_status kiln_model_load(const char *config, const char *weights,
			    const struct kiln_infer_opts *opts, struct kiln_infer **out,
			    char **err)
{
	struct kiln_config *cfg = NULL;
	struct kiln_registry *reg = NULL;
	kiln_status st;
	if (out)
		*out = NULL;
	if (err)
		*err = NULL;
	if (!out)
		st = kiln_error(KILN_EINVAL, "kiln_model_load: out is NULL (where the model goes)");
	else if (!config)
		st = kiln_error(KILN_EINVAL, "kiln_model_load: no config");
	else if (opts && opts->config_is_text)
		st = kiln_config_load_string(config, "config text", &cfg);
	else
		st = kiln_config_load(config, &cfg);
	if (!st && !(st = kiln_config_validate(cfg, NULL)) &&
	    !(st = kiln_registry_open(opts ? opts->plugin_path : NULL, &reg)) &&
	    !(st = kiln_config_validate(cfg, reg)))
		st = kiln_infer_open(cfg, reg, weights, opts, out);
	if (st) {
		if (err)
			*err = strdup(kiln_last_error());
		kiln_registry_close(reg);
		kiln_config_free(cfg);
		return st;
	}
	(*out)->own_cfg = cfg;
	(*out)->own_reg = reg;
	return KILN_OK;
}

/* The inference graph: the trained model replaced by its folded one
 * (core/infer_passes.h), with the INT8 keys and weights of m->quantized
 * (core/quant.h), on the same device; the same steps as `kiln eval
 * --fold` and `--quantized`. */
static kiln_status infer_fold(struct kiln_infer *m)
{
	struct kiln_fold_host *h = NULL;
	struct kiln_model *fm = NULL;
	int n = 0;
	kiln_status st = KILN_OK;
	if (m->quantized && !m->qf && (st = kiln_quant_open(m->quantized, &m->qf)))
		return st;
	struct kiln_safetensors *qf = m->qf;
	/* the residual adds into the convs' epilogues in f32 (the INT8 path
	 * quantizes the adds themselves); the trained weights copied to host
	 * memory and freed on the device before the folded model is built,
	 * so that the two models are never both held (before session 38 they
	 * were, with a host copy of each: 64 MB peak RSS for predict of one
	 * image with the Fashion-MNIST CNN, now 52; 43-49 with --no-fold).  An INT8 model's trained
	 * weights are none (need_trained < 0): nothing to copy */
	if (!(st = kiln_infer_fold_config_ex(m->t.m, (struct kiln_registry *)m->reg,
					     qf ? KILN_FOLD_INT8 : m->no_residual ? 0 : KILN_FOLD_RESIDUAL,
					     &m->fcfg, &n)) &&
	    !(st = qf ? kiln_quant_config_check(qf, m->cfg, m->reg) : KILN_OK) &&
	    !(st = qf ? kiln_quant_config(m->fcfg, qf) : KILN_OK) &&
	    !(st = qf ? KILN_OK : kiln_infer_fold_read(m->t.m, m->t.stream, &h)) &&
	    !(st = kiln_model_weights_free(m->t.m, m->t.stream)) &&
	    !(st = kiln_model_create_infer(m->fcfg, m->reg, m->t.dev, &m->t.sample, NULL, &fm)) &&
	    !(st = kiln_model_init_loaded(fm, m->t.stream)))
		st = qf ? kiln_quant_load(fm, qf, m->t.stream)
			: kiln_infer_fold_write(m->t.m, h, fm, m->t.stream);
	if (!st)
		st = kiln_device_stream_sync(m->t.dev, m->t.stream);
	kiln_infer_fold_host_free(h);
	kiln_safetensors_close(qf);
	m->qf = NULL;
	if (st) {
		kiln_model_free(fm);
		return m->quantized ? kiln_error_wrap(st, "%s", m->quantized) : st;
	}
	kiln_log(KILN_LOG_INFO, "infer", "folded: %d layers removed (batchnorm into conv/linear, dropout%s), [run] fuse = 1%s",
		 n, qf || m->no_residual ? "" : ", residual add into conv", qf ? "; INT8 conv/linear" : "");
	kiln_model_free(m->t.m);
	m->t.m = fm;
#ifdef __GLIBC__
	/* the host copies of both models' weights were freed into malloc's
	 * heap (glibc's mmap threshold rises to the size of a freed mapped
	 * block, so the later copies land there), not given back: without
	 * this the first batch's buffers came on top of them (a higher peak,
	 * 69 MB, than with both models held, 64) */
	malloc_trim(0);
#endif
	return KILN_OK;
}

/* The activation bytes a row of an inference plan of m->batch rows: its
 * memory laid out (a dry plan) with the device preparing nothing
 * (kiln_device_layout_only): the arena of the batch plan, without the
 * device's primitives of the batch (nor the CPU tuner's timings of them)
 * when the plan that runs is a block's. */
static kiln_status infer_row_bytes(struct kiln_infer *m, size_t *row)
{
	struct kiln_plan_opts o = { .logits = 1, .frozen = 1, .dry = 1 };
	struct kiln_plan *p = NULL;
	kiln_device_layout_only(m->t.dev, 1);
	kiln_status st = kiln_model_plan_ex(m->t.m, m->batch, &o, &p);
	kiln_device_layout_only(m->t.dev, 0);
	if (!st)
		*row = kiln_plan_arena_bytes(p) / (size_t)m->batch;
	kiln_plan_free(p);
	return st;
}

/* [run] infer_block: the rows of one run (m->run) of a batch of m->batch
 * rows: fewer where kiln_infer_block_rows says so (`auto`, on a device
 * that computes in host memory only) or the config names fewer. */
static kiln_status infer_block(struct kiln_infer *m)
{
	const char *v = "auto";
	int64_t rows = m->batch, threads = 0;
	size_t row = 0;
	char *end;
	kiln_status st = kiln_config_get_str(m->cfg, "run", "infer_block", &v);
	if (st && st != KILN_ENOTFOUND)
		return st;
	if (!strcmp(v, "auto")) {
		long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
		if (kiln_config_get_int(m->cfg, "run", "threads", &threads) || threads <= 0)
			threads = sysconf(_SC_NPROCESSORS_ONLN);
		if (kiln_device_traits(m->t.dev)->caps & KILN_DEVICE_HOST_MEMORY) {
			if ((st = infer_row_bytes(m, &row)))
				return st;
			rows = kiln_infer_block_rows(m->batch, row, m->t.m->n_elems * sizeof(float),
						     2 * (size_t)(l2 > 0 ? l2 : 1 << 20) * (size_t)(threads > 0 ? threads : 1));
		}
	} else {
		const long long n = strtoll(v, &end, 10);
		if (end == v || *end || n < 0)
			return kiln_error(KILN_ECONFIG, "%s: [run] infer_block = '%s': `auto`, 0 or a row count",
					  kiln_config_where(m->cfg, "run", "infer_block"), v);
		rows = n && n < m->batch ? n : m->batch;
		if (rows < m->batch && (st = infer_row_bytes(m, &row)))
			return st;
	}
	m->run = rows;
	if (rows < m->batch)
		kiln_log(KILN_LOG_INFO, "infer", "batch of %lld rows in blocks of %lld ([run] infer_block = %s: %zu activation bytes a row)",
			 (long long)m->batch, (long long)rows, v, row);
	return KILN_OK;
}

int64_t kiln_infer_run_rows(const struct kiln_infer *m) { return m->run; }

kiln_status kiln_infer_prepare(struct kiln_infer *m)
{
	struct kiln_plan_opts o = { .logits = 1, .frozen = 1 }; /* its weights stay */
	void *ptr;
	kiln_status st;
	if (!m)
		return kiln_error(KILN_EINVAL, "kiln_infer_prepare: the model is NULL");
	if (m->prepared)
		return KILN_OK;
	m->in_bytes = kiln_tensor_bytes(&m->t.sample);
	/* [run] precision's compute dtype, as `kiln eval` runs it (the
	 * weights are cast before the first forward); no loss scaler, as
	 * nothing is trained (before session 42 fp16 allocated one and
	 * logged its scale) */
	if ((!m->no_fold && (st = infer_fold(m))) ||
	    (st = kiln_model_compute_open(m->t.m, m->reg)))
		return st;
	/* the block's rows decided first: only the plan that runs is
	 * prepared */
	if ((st = infer_block(m)) ||
	    (st = kiln_model_plan_ex(m->t.m, m->run, &o, &m->p)) ||
	    (st = kiln_plan_logits(m->p, &ptr, &m->out)) ||
	    (st = kiln_device_alloc(m->t.dev, m->in_bytes * (size_t)m->run, &m->x_d)))
		return st;
	m->lo_dtype = m->out.dtype;
	if (m->lo_dtype != KILN_F32 && m->lo_dtype != KILN_BF16 && m->lo_dtype != KILN_F16)
		return kiln_error(KILN_ENOTSUP, "the model's logits are %s: inference reads f32, bf16 or f16 logits",
				  kiln_dtype_name(m->out.dtype));
	m->out.dtype = KILN_F32; /* what the caller gets */
	/* one sample's logits: drop the batch dimension */
	for (int i = 1; i < m->out.ndim; i++)
		m->out.dims[i - 1] = m->out.dims[i];
	m->out.ndim--;
	m->out_elems = (size_t)kiln_tensor_numel(&m->out);
	if (m->lo_dtype != KILN_F32 &&
	    !(m->lo_h = malloc(sizeof(uint16_t) * m->out_elems * (size_t)m->run)))
		return kiln_error(KILN_ENOMEM, "out of memory");
	m->prepared = 1;
	return KILN_OK;
}

struct kiln_model *kiln_infer_model(const struct kiln_infer *m, void **stream)
{
	*stream = m->t.stream;
	return m->t.m;
}

int kiln_infer_input_shape(const struct kiln_infer *m, int64_t *dims, int *dtype)
{
	if (!m || !dims)
		return 0;
	for (int i = 0; i < m->t.sample.ndim; i++)
		dims[i] = m->t.sample.dims[i];
	if (dtype)
		*dtype = m->t.sample.dtype;
	return m->t.sample.ndim;
}

int kiln_infer_output_shape(const struct kiln_infer *m, int64_t *dims)
{
	if (!m || !dims)
		return 0;
	for (int i = 0; i < m->out.ndim; i++)
		dims[i] = m->out.dims[i];
	return m->out.ndim;
}

size_t kiln_infer_input_bytes(const struct kiln_infer *m) { return m ? m->in_bytes : 0; }
size_t kiln_infer_output_elems(const struct kiln_infer *m) { return m ? m->out_elems : 0; }

/* The plan for `rows` rows: the model's batch plan, or the remainder's
 * (made again when a call ends on another row count). */
static kiln_status rows_plan(struct kiln_infer *m, int64_t rows, struct kiln_plan **p)
{
	struct kiln_plan_opts o = { .logits = 1, .frozen = 1 }; /* its weights stay */
	kiln_status st;
	if (rows == m->run) {
		*p = m->p;
		return KILN_OK;
	}
	if (m->rem && m->rem_rows != rows) {
		if ((st = kiln_device_stream_sync(m->t.dev, m->t.stream)))
			return st;
		kiln_plan_free(m->rem);
		m->rem = NULL;
	}
	if (!m->rem && (st = kiln_model_plan_ex(m->t.m, rows, &o, &m->rem)))
		return st;
	m->rem_rows = rows;
	*p = m->rem;
	return KILN_OK;
}

/* bf16/f16 logits ([run] precision) of `rows` rows, staged in lo_h, as
 * the f32 the caller reads. */
static void logits_to_f32(const struct kiln_infer *m, int64_t rows, float *out)
{
	const size_t n = m->out_elems * (size_t)rows;
	if (!m->lo_h)
		return;
	for (size_t i = 0; i < n; i++) {
		uint32_t b = (uint32_t)m->lo_h[i] << 16;
		if (m->lo_dtype == KILN_F16)
			out[i] = kiln_half_to_float(m->lo_h[i]);
		else
			memcpy(&out[i], &b, sizeof b);
	}
}

/* Where the plan reads rows starting at host pointer xr: in place when
 * the device computes on host memory (the CPU) and xr is aligned as the
 * device's own buffers are, so a batch is not copied before it is read
 * (3-4% of the MLP's call); else copied into x_d. */
static kiln_status rows_input(struct kiln_infer *m, const char *xr, int64_t rows, const void **xd)
{
	if ((kiln_device_traits(m->t.dev)->caps & KILN_DEVICE_HOST_MEMORY) &&
	    (uintptr_t)xr % 64 == 0) {
		*xd = xr;
		return KILN_OK;
	}
	*xd = m->x_d;
	return kiln_device_copy_async(m->t.dev, m->x_d, xr, (size_t)rows * m->in_bytes,
				      KILN_COPY_H2D, m->t.stream);
}

/* Rows [off, off + rows) of x through the model into out. */
static kiln_status infer_rows(struct kiln_infer *m, const char *x, int64_t off, int64_t rows,
			      float *out)
{
	struct kiln_device *dev = m->t.dev;
	struct kiln_plan *p;
	struct kiln_tensor_desc d;
	const void *xd;
	void *logits;
	kiln_status st;
	if ((st = rows_plan(m, rows, &p)) ||
	    (st = rows_input(m, x + (size_t)off * m->in_bytes, rows, &xd)) ||
	    (st = kiln_plan_forward(p, xd, NULL, NULL, m->t.stream)) ||
	    (st = kiln_plan_logits(p, &logits, &d)) ||
	    (st = kiln_device_copy_async(dev, m->lo_h ? (void *)m->lo_h : (void *)(out + (size_t)off * m->out_elems),
					 logits, kiln_dtype_size(m->lo_dtype) * m->out_elems * (size_t)rows,
					 KILN_COPY_D2H, m->t.stream)) ||
	    /* the next rows reuse x_d, and the caller may reuse x: wait */
	    (st = kiln_device_stream_sync(dev, m->t.stream)))
		return kiln_error_wrap(st, "samples %lld..%lld", (long long)off,
				       (long long)(off + rows - 1));
	logits_to_f32(m, rows, out + (size_t)off * m->out_elems);
	return KILN_OK;
}

kiln_status kiln_infer(struct kiln_infer *m, const void *x, int64_t n, float *out)
{
	kiln_status st = KILN_OK;
	if (!m || n < 0 || (n && (!x || !out)))
		return kiln_error(KILN_EINVAL, "kiln_infer: %s", !m ? "no model" : n < 0 ? "a negative count" : "a NULL buffer");
	pthread_mutex_lock(&m->lock);
	for (int64_t off = 0; off < n && !st; off += m->run)
		st = infer_rows(m, x, off, n - off < m->run ? n - off : m->run, out);
	pthread_mutex_unlock(&m->lock);
	return st;
}

/* [data.eval]'s transform keys and which image sizes and channel counts
 * they take, for source images of h x w x c (0: any size, any count when
 * the keys resize or convert them). */
static void image_xform_keys(struct kiln_infer *m, int32_t h, int32_t w, int32_t c,
			     const struct kiln_xform *xf)
{
	const char *dt = kiln_config_get(m->cfg, "data.eval", "dtype");
	m->xf = *xf;
	m->xf.out_dtype = KILN_F32;
	m->xf.nhwc = 0; /* samples are CHW, as the loader stages them */
	/* the loader's bf16 samples, widened on the device: the f32 rounded */
	m->bf16 = dt && !strcmp(dt, "bf16");
	const int sized = strcmp(kiln_config_where(m->cfg, "data.eval", "size"), "default") ||
			  strcmp(kiln_config_where(m->cfg, "data.eval", "resize"), "default");
	m->src_h = sized ? 0 : h;
	m->src_w = sized ? 0 : w;
	m->src_c = strcmp(kiln_config_where(m->cfg, "data.eval", "channels"), "default") ? 0 : c;
	m->have_xf = 1;
}

/* [data.eval]'s transforms for the images of kiln_infer_image: its
 * source's image size and the transform keys; f32 output (what
 * transform_on = device computes on the device, computed here).  The size
 * is the source's peek's (an IDX file's header, the shards' headers, a
 * folder's none) where it has one, else the eval set is opened as `kiln
 * eval` opens it (before session 39 always: a folder's every file listed,
 * an IDX file inflated, for three numbers).  When [data.eval]'s source
 * cannot be read (unreadable or missing files: a model shipped without
 * its data), its images are taken to be of the model's input size and
 * channels (a [C, H, W] sample). */
static kiln_status image_xform(struct kiln_infer *m)
{
	struct kiln_dataset ds;
	struct kiln_xform xf;
	const struct kiln_tensor_desc *in = &m->t.sample;
	int peeked = 0;
	kiln_status st = kiln_dataset_peek(m->cfg, m->reg, "data.eval", "test", 0, &ds, &peeked);
	if (!st && !peeked)
		st = kiln_dataset_open(m->cfg, m->reg, "data.eval", "test", 0, &ds);
	/* (a file missing is a config error, exit 2, since session 37: taken
	 * here as before, ds.missing) */
	if ((st == KILN_EDATA || st == KILN_EIO || st == KILN_ENOTFOUND || ds.missing) &&
	    in->ndim == 3) {
		kiln_log(KILN_LOG_INFO, "predict", "[data.eval] is not readable (%s): images of the model's input, %lldx%lld with %lld channel(s), through its transform keys",
			 kiln_last_error(), (long long)in->dims[2], (long long)in->dims[1],
			 (long long)in->dims[0]);
		kiln_dataset_close(&ds);
		st = kiln_xform_from_config(m->cfg, "data.eval", 0, (int32_t)in->dims[1],
					    (int32_t)in->dims[2], (int32_t)in->dims[0], &xf);
		if (!st)
			image_xform_keys(m, (int32_t)in->dims[1], (int32_t)in->dims[2],
					 (int32_t)in->dims[0], &xf);
		return st ? kiln_error_wrap(st, "the image transforms of [data.eval]") : KILN_OK;
	}
	if (!st && !ds.use_image)
		st = kiln_error(KILN_ENOTSUP, "[data.eval] source '%s' hands over finished samples, not images: this model reads no images",
				ds.name);
	if (!st)
		image_xform_keys(m, ds.info.image_h, ds.info.image_w, ds.info.image_c, &ds.xf);
	kiln_dataset_close(&ds);
	return st ? kiln_error_wrap(st, "the image transforms of [data.eval]") : KILN_OK;
}

/* What kiln_infer_image refuses before it looks at the model's images:
 * KILN_EINVAL for NULL arguments and pixels the image does not have,
 * KILN_EDATA for a channel count no image has. */
static kiln_status image_args(const struct kiln_infer *m, const struct kiln_image *img,
			      const char *what, const void *x)
{
	if (!m || !img || !x)
		return kiln_error(KILN_EINVAL, "kiln_infer_image: %s is NULL", !m ? "the model" : !img ? "img" : "x");
	if (!img->data)
		return kiln_error(KILN_EINVAL, "%s: kiln_image.data is NULL", what);
	if (img->c != 1 && img->c != 3)
		return kiln_error(KILN_EDATA, "%s: %d channels: images have 1 (gray) or 3 (RGB)", what,
				  img->c);
	if (img->h < 1 || img->w < 1)
		return kiln_error(KILN_EINVAL, "%s: a %dx%d image (width x height) has no pixels", what,
				  img->w, img->h);
	const uint64_t need = (uint64_t)img->h * (uint64_t)img->w * (uint64_t)img->c;
	if (img->cap < need)
		return kiln_error(KILN_EINVAL, "%s: kiln_image.cap is %zu bytes, less than its %dx%dx%d pixels (%llu bytes)",
				  what, img->cap, img->w, img->h, img->c, (unsigned long long)need);
	return KILN_OK;
}

kiln_status kiln_infer_image(struct kiln_infer *m, const struct kiln_image *img,
			     const char *what, void *x)
{
	if (!what)
		what = "image";
	kiln_status st = image_args(m, img, what, x);
	if (st)
		return st;
	/* a token model (GPT, an LM: i32 token ids) reads no images, whatever
	 * [data.eval] holds: before session 33 its path's error came first
	 * (a missing shard), or a source's remark */
	if (m->t.sample.dtype == KILN_I32)
		return kiln_error(KILN_ENOTSUP, "%s: this model reads tokens (i32 [%lld] token ids), not images: kiln_infer_image has nothing to give it; pass token ids to kiln_infer",
				  what, (long long)m->t.sample.dims[0]);
	pthread_mutex_lock(&m->lock);
	if (!m->have_xf)
		st = image_xform(m);
	if (st)
		goto out;
	if ((m->src_h && (img->h != m->src_h || img->w != m->src_w)))
		st = kiln_error(KILN_EDATA, "%s: %dx%d pixels, the model reads %dx%d images ([data.eval] sets no size or resize to resize them)",
				what, img->w, img->h, m->src_w, m->src_h);
	else if (m->src_c && img->c != m->src_c)
		st = kiln_error(KILN_EDATA, "%s: %d channel%s, the model reads %d-channel images ([data.eval] sets no channels to convert them)",
				what, img->c, img->c == 1 ? "" : "s", m->src_c);
	else if (kiln_xform_out_bytes(&m->xf) != m->in_bytes)
		st = kiln_error(KILN_ECONFIG, "[data.eval]'s transforms make %zu-byte samples, the model reads %zu",
				kiln_xform_out_bytes(&m->xf), m->in_bytes);
	else if ((st = kiln_xform_apply(&m->xf, img, 0, 0, 0, x, &m->xs)))
		st = kiln_error_wrap(st, "%s", what);
	else if (m->bf16)
		kiln_f32_round_bf16(x, m->in_bytes / sizeof(float));
out:
	pthread_mutex_unlock(&m->lock);
	return st;
}

/* [data.eval] opened for a pass: samples staged as the model takes them
 * (u8 pixels or bf16 widened on the host, the values transform_on =
 * device and dtype = bf16 give on the device: *bf16, the caller rounds
 * the f32 samples to bf16 values, as the loader's cast and the device's
 * widening make them). */
static kiln_status eval_set_open(struct kiln_infer *m, struct kiln_dataset *ds, int *bf16)
{
	kiln_status st = kiln_dataset_open(m->cfg, m->reg, "data.eval", "test", 0, ds);
	*bf16 = 0;
	if (st)
		return st;
	if (ds->use_image && kiln_dataset_widened(ds)) {
		ds->xf.out_dtype = KILN_F32;
		*bf16 = ds->bf16;
		ds->bf16 = 0;
		ds->sample.dtype = KILN_F32;
		ds->sample_bytes = kiln_tensor_bytes(&ds->sample);
	}
	if (ds->sample_bytes != m->in_bytes)
		return kiln_error(KILN_ECONFIG, "[data.eval] source '%s' gives %zu-byte samples, the model reads %zu",
				  ds->name, ds->sample_bytes, m->in_bytes);
	return KILN_OK;
}

kiln_status kiln_infer_eval_set(struct kiln_infer *m, kiln_infer_rows_fn fn, void *user)
{
	if (!m || !fn)
		return kiln_error(KILN_EINVAL, "kiln_infer_eval_set: %s is NULL", !m ? "the model" : "fn");
	struct kiln_dataset ds = { 0 };
	struct kiln_data_scratch scratch = { 0 };
	const int64_t B = m->batch;
	int64_t *idx = malloc(sizeof(int64_t) * (size_t)B);
	void *x = NULL; /* 64-byte aligned: read in place (rows_input) */
	int32_t *y = NULL;
	float *out = malloc(sizeof(float) * m->out_elems * (size_t)B);
	int bf16 = 0;
	kiln_status st = idx && out ? eval_set_open(m, &ds, &bf16) : kiln_error(KILN_ENOMEM, "out of memory");
	if (!st && (posix_memalign(&x, 64, m->in_bytes * (size_t)B) ||
		    !(y = malloc(ds.label_bytes * (size_t)B))))
		st = kiln_error(KILN_ENOMEM, "out of memory");
	for (int64_t off = 0; !st && off < ds.len; off += B) {
		const int64_t rows = ds.len - off < B ? ds.len - off : B;
		for (int64_t i = 0; i < rows; i++)
			idx[i] = off + i;
		if (!(st = kiln_dataset_read_rows(&ds, 0, idx, rows, x, y, &scratch)) && bf16)
			kiln_f32_round_bf16(x, m->in_bytes / sizeof(float) * (size_t)rows);
		if (!st && !(st = kiln_infer(m, x, rows, out)))
			st = fn(user, off, rows, out, y, ds.label_elems);
	}
	kiln_dataset_close(&ds);
	kiln_data_scratch_free(&scratch);
	free(idx);
	free(x);
	free(y);
	free(out);
	return st;
}

void kiln_infer_free(struct kiln_infer *m)
{
	if (!m)
		return;
	if (m->t.stream)
		kiln_device_stream_sync(m->t.dev, m->t.stream);
	kiln_plan_free(m->p);
	kiln_plan_free(m->rem);
	if (m->t.dev)
		kiln_device_free(m->t.dev, m->x_d);
	kiln_trained_close(&m->t);
	kiln_config_free(m->fcfg);
	free(m->quantized);
	kiln_safetensors_close(m->qf);
	free(m->lo_h);
	kiln_xform_scratch_free(&m->xs);
	pthread_mutex_destroy(&m->lock);
	kiln_registry_close(m->own_reg);
	kiln_config_free(m->copy);
	kiln_config_free(m->own_cfg);
	free(m);
}
