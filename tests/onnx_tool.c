/* tests/onnx_tool.c - what tests/onnx_export.sh, tests/onnx_ort.sh and
 * bench/onnx.sh need around `kiln export --onnx`:
 *
 *   onnx_tool dump MODEL.onnx [WEIGHTS.safetensors]
 *       parse MODEL back with protobuf-c (libonnx-dev's schema) and print
 *       its IR version and opset, input and output (name, type, shape), the
 *       node ops in order, each integer attribute ("attr NODE OP NAME
 *       VALUE": "attr cat Concat axis 3") and its initializers; with WEIGHTS (`kiln export
 *       --safetensors` of the same model), every initializer named like a
 *       weight must hold its exact bytes and every weight must be there:
 *       exit 1 otherwise.
 *   onnx_tool logits CONFIG ROWS OUT [--time R] [--no-fold] [--no-residual] [--quantized Q] [--infer] [--plan-batch B] [section.key=value ...]
 *       kiln's evaluation of CONFIG's model (the weights `kiln export`
 *       takes; [model] init_from as an override) on the first ROWS samples
 *       of the test split ([data.eval]): OUT.x.f32 / OUT.x.i32 (the input)
 *       and OUT.logits.f32 (what the loss layer reads), raw little-endian
 *       with OUT.shape ("x: 1000 1 28 28" / "logits: 1000 10").  --time R:
 *       then R timed kiln_infer calls on those ROWS host samples (the C
 *       inference API, batch ROWS: the folded, fused inference plan `kiln
 *       predict` runs; --no-fold: the model as trained; --no-residual:
 *       folded, but each residual add a layer of its own), the lines
 *       "kiln_ms <median>" and "kiln_cpu_ms <median>" (the process's
 *       CPU time per call: every thread's) on stdout.  --quantized Q: the logits (and the
 *       timing) of the INT8 model Q, through kiln_infer as `kiln eval
 *       --quantized` runs it.  --infer: the logits of kiln_infer's fp32
 *       plan (folded, the residuals in the convs: what `kiln predict`
 *       runs) instead of the evaluation's.  --plan-batch B: the timed
 *       calls' kiln_infer_opts.batch (default ROWS).
 */
#include "core/graph.h"
#include "core/data.h"
#include "core/proto/onnx.pb-c.h"
#include <kiln/infer.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int fail(const char *what)
{
	fprintf(stderr, "onnx_tool: %s\n", what);
	return 1;
}

static int fail_st(kiln_status st)
{
	fprintf(stderr, "onnx_tool: %s\n", kiln_last_error());
	return st == KILN_ECONFIG ? 2 : 1;
}

/* ---- dump ------------------------------------------------------------------- */

static const char *elem_name(int t)
{
	return t == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT   ? "f32"
	       : t == ONNX__TENSOR_PROTO__DATA_TYPE__INT32 ? "i32"
	       : t == ONNX__TENSOR_PROTO__DATA_TYPE__INT64 ? "i64"
	       : t == ONNX__TENSOR_PROTO__DATA_TYPE__BOOL  ? "bool"
	       : t == ONNX__TENSOR_PROTO__DATA_TYPE__INT8  ? "i8"
	       : t == ONNX__TENSOR_PROTO__DATA_TYPE__UINT8 ? "u8"
							   : "other";
}

static void print_value(const char *what, const Onnx__ValueInfoProto *v)
{
	const Onnx__TypeProto__Tensor *t = v->type ? v->type->tensor_type : NULL;
	printf("%s %s %s", what, v->name, t ? elem_name(t->elem_type) : "?");
	for (size_t d = 0; t && t->shape && d < t->shape->n_dim; d++) {
		const Onnx__TensorShapeProto__Dimension *dim = t->shape->dim[d];
		if (dim->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM)
			printf("%s%s", d ? "," : " ", dim->dim_param);
		else
			printf("%s%lld", d ? "," : " ", (long long)dim->dim_value);
	}
	printf("\n");
}

static const Onnx__TensorProto *find_init(const Onnx__GraphProto *g, const char *name)
{
	for (size_t k = 0; k < g->n_initializer; k++)
		if (!strcmp(g->initializer[k]->name, name))
			return g->initializer[k];
	return NULL;
}

/* Every weight of w (num_batches_tracked aside) an initializer of g with
 * the same shape and bytes (f32; i8 and the scales of an INT8 model's file
 * too); the count compared, -1 on a mismatch. */
static int compare_weights(const Onnx__GraphProto *g, const char *path)
{
	struct kiln_safetensors *f;
	if (kiln_safetensors_open(path, &f))
		return fail_st(KILN_EIO), -1;
	int n = 0, bad = 0;
	for (int k = 0; k < kiln_safetensors_count(f); k++) {
		struct kiln_safetensors_tensor t;
		kiln_safetensors_get(f, k, &t);
		if (strstr(t.name, "num_batches_tracked"))
			continue;
		const Onnx__TensorProto *o = find_init(g, t.name);
		size_t numel = 1;
		for (int d = 0; d < t.ndim; d++)
			numel *= (size_t)t.dims[d];
		/* f32, or an INT8 model's i8 weights; a [1] scale may be a scalar */
		const int i8 = t.dtype == KILN_I8;
		const size_t bytes = numel * (i8 ? 1 : sizeof(float));
		const int scalar = o && o->n_dims == 0 && t.ndim == 1 && numel == 1;
		int same = o && (t.dtype == KILN_F32 || i8) &&
			   o->data_type == (i8 ? ONNX__TENSOR_PROTO__DATA_TYPE__INT8
					       : ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT) &&
			   (o->n_dims == (size_t)t.ndim || scalar) && o->has_raw_data &&
			   o->raw_data.len == bytes;
		for (int d = 0; same && !scalar && d < t.ndim; d++)
			same = o->dims[d] == t.dims[d];
		same = same && !memcmp(o->raw_data.data, t.data, bytes);
		if (!same) {
			printf("MISMATCH %s\n", t.name);
			bad++;
		}
		n++;
	}
	kiln_safetensors_close(f);
	return bad ? -1 : n;
}

static int cmd_dump(int argc, char **argv)
{
	if (argc < 3)
		return fail("usage: onnx_tool dump MODEL.onnx [WEIGHTS.safetensors]");
	FILE *f = fopen(argv[2], "rb");
	if (!f)
		return fail("cannot open the model");
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, 0, SEEK_SET);
	uint8_t *buf = malloc((size_t)n + 1);
	if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
		fclose(f);
		free(buf);
		return fail("cannot read the model");
	}
	fclose(f);
	Onnx__ModelProto *m = onnx__model_proto__unpack(NULL, (size_t)n, buf);
	free(buf);
	if (!m || !m->graph)
		return fail("not an ONNX model");
	const Onnx__GraphProto *g = m->graph;
	printf("ir %lld opset %lld producer %s\n", (long long)m->ir_version,
	       m->n_opset_import ? (long long)m->opset_import[0]->version : -1LL,
	       m->producer_name ? m->producer_name : "?");
	for (size_t k = 0; k < g->n_input; k++)
		print_value("input", g->input[k]);
	for (size_t k = 0; k < g->n_output; k++)
		print_value("output", g->output[k]);
	printf("ops");
	for (size_t k = 0; k < g->n_node; k++)
		printf(" %s", g->node[k]->op_type);
	printf("\n");
	for (size_t k = 0; k < g->n_node; k++) /* the integer attributes */
		for (size_t a = 0; a < g->node[k]->n_attribute; a++) {
			const Onnx__AttributeProto *at = g->node[k]->attribute[a];
			if (at->type == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT)
				printf("attr %s %s %s %lld\n", g->node[k]->name, g->node[k]->op_type,
				       at->name, (long long)at->i);
		}
	for (size_t k = 0; k < g->n_initializer; k++) {
		const Onnx__TensorProto *t = g->initializer[k];
		printf("init %s %s", t->name, elem_name(t->data_type));
		for (size_t d = 0; d < t->n_dims; d++)
			printf("%s%lld", d ? "," : " ", (long long)t->dims[d]);
		printf("\n");
	}
	int rc = 0;
	if (argc > 3) {
		int same = compare_weights(g, argv[3]);
		if (same < 0)
			rc = 1;
		else
			printf("weights %d equal\n", same);
	}
	onnx__model_proto__free_unpacked(m, NULL);
	return rc;
}

/* ---- logits ----------------------------------------------------------------- */

static int write_raw(const char *out, const char *ext, const void *p, size_t bytes)
{
	char path[4096];
	snprintf(path, sizeof path, "%s.%s", out, ext);
	FILE *f = fopen(path, "wb");
	int ok = f && fwrite(p, 1, bytes, f) == bytes;
	if (f && fclose(f))
		ok = 0;
	return ok ? 0 : fail("cannot write an output file");
}

static double clock_ms(clockid_t id)
{
	struct timespec ts;
	clock_gettime(id, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static double now_ms(void) { return clock_ms(CLOCK_MONOTONIC); }

static int cmp_double(const void *a, const void *b)
{
	const double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* R timed kiln_infer calls on the host batch x (rows rows) after two
 * warm-ups: the C inference API's path (include/kiln/infer.h), as `kiln
 * predict` and an embedding program run it, with o's no_fold,
 * no_residual and quantized; the median in ms. */
static double median_of(double *v, int R)
{
	qsort(v, (size_t)R, sizeof *v, cmp_double);
	return R % 2 ? v[R / 2] : (v[R / 2 - 1] + v[R / 2]) / 2;
}

static kiln_status time_infer(struct kiln_config *cfg, const struct kiln_registry *reg,
			      int64_t rows, const void *x, const struct kiln_infer_opts *base,
			      int R, double *median, double *cpu_median)
{
	struct kiln_infer_opts o = *base;
	if (!o.batch)
		o.batch = rows;
	struct kiln_infer *m;
	kiln_status st = kiln_infer_open(cfg, reg, NULL, &o, &m);
	if (st)
		return st;
	double *ms = calloc((size_t)R, sizeof *ms), *cpu = calloc((size_t)R, sizeof *cpu);
	float *out = malloc(sizeof(float) * kiln_infer_output_elems(m) * (size_t)rows);
	if (!ms || !cpu || !out)
		st = kiln_error(KILN_ENOMEM, "out of memory");
	for (int r = -2; r < R && !st; r++) { /* two warm-up passes */
		const double t0 = now_ms(), c0 = clock_ms(CLOCK_PROCESS_CPUTIME_ID);
		st = kiln_infer(m, x, rows, out);
		if (r >= 0) {
			ms[r] = now_ms() - t0;
			cpu[r] = clock_ms(CLOCK_PROCESS_CPUTIME_ID) - c0;
		}
	}
	if (!st) {
		*median = median_of(ms, R);
		*cpu_median = median_of(cpu, R);
	}
	free(ms);
	free(cpu);
	free(out);
	kiln_infer_free(m);
	return st;
}

/* The logits of kiln_infer's plan on the host batch x (rows rows) into
 * out: the INT8 model `quantized`, as `kiln eval --quantized` computes
 * them, or (NULL) the folded fp32 plan `kiln predict` runs. */
static kiln_status infer_logits(struct kiln_config *cfg, const struct kiln_registry *reg,
				int64_t rows, const void *x, const char *quantized, float *out)
{
	const struct kiln_infer_opts o = { .batch = rows, .quantized = quantized };
	struct kiln_infer *m;
	kiln_status st = kiln_infer_open(cfg, reg, NULL, &o, &m);
	if (st)
		return st;
	st = kiln_infer(m, x, rows, out);
	kiln_infer_free(m);
	return st;
}

/* The first rows samples of the test split into x (host) and labels. */
static kiln_status read_batch(const struct kiln_config *cfg, const struct kiln_registry *reg,
			      int64_t rows, void **x, int32_t **y, struct kiln_tensor_desc *d)
{
	struct kiln_dataset ds;
	struct kiln_data_scratch scratch;
	memset(&ds, 0, sizeof ds);
	memset(&scratch, 0, sizeof scratch);
	const char *sec = "data";
	for (int i = 0; kiln_config_section(cfg, i); i++)
		if (!strcmp(kiln_config_section(cfg, i), "data.eval"))
			sec = "data.eval";
	kiln_status st = kiln_dataset_open(cfg, reg, sec, "test", 0, &ds);
	if (st)
		return st;
	if (kiln_dataset_widened(&ds)) {
		kiln_dataset_close(&ds);
		return kiln_error(KILN_ENOTSUP, "onnx_tool: samples widened on the device: use f32 samples");
	}
	kiln_dataset_input_desc(&ds, d);
	int64_t *idx = calloc((size_t)rows, sizeof *idx);
	/* 64-byte aligned, as a program that wants kiln_infer to read it in
	 * place allocates it */
	if (posix_memalign(x, 64, (size_t)rows * kiln_tensor_bytes(d)))
		*x = NULL;
	*y = calloc((size_t)rows, sizeof(int32_t) * 4096);
	for (int64_t r = 0; idx && r < rows; r++)
		idx[r] = r;
	if (!idx || !*x || !*y)
		st = KILN_ENOMEM;
	else
		st = kiln_dataset_read_rows(&ds, 0, idx, rows, *x, *y, &scratch);
	kiln_data_scratch_free(&scratch);
	free(idx);
	kiln_dataset_close(&ds);
	return st;
}

static int cmd_logits(int argc, char **argv)
{
	if (argc < 5)
		return fail("usage: onnx_tool logits CONFIG ROWS OUT [--time R] [--no-fold] [--no-residual] [--quantized Q] [--infer] [section.key=value ...]");
	const int64_t rows = strtoll(argv[3], NULL, 10);
	const char *out = argv[4];
	int R = 0, infer = 0;
	struct kiln_infer_opts io = { 0 };
	struct kiln_config *cfg;
	struct kiln_registry *reg;
	kiln_status st = kiln_config_load(argv[2], &cfg);
	if (st)
		return fail_st(st);
	for (int i = 5; i < argc && !st; i++) {
		if (!strcmp(argv[i], "--time") && i + 1 < argc)
			R = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--no-fold"))
			io.no_fold = 1;
		else if (!strcmp(argv[i], "--no-residual"))
			io.no_residual = 1;
		else if (!strcmp(argv[i], "--quantized") && i + 1 < argc)
			io.quantized = argv[++i];
		else if (!strcmp(argv[i], "--infer"))
			infer = 1;
		else if (!strcmp(argv[i], "--plan-batch") && i + 1 < argc)
			io.batch = strtoll(argv[++i], NULL, 10);
		else
			st = kiln_config_override(cfg, argv[i]);
	}
	if (st || (st = kiln_registry_open(NULL, &reg)))
		return fail_st(st);
	struct kiln_trained t;
	void *x = NULL, *x_d = NULL, *y_d = NULL, *metrics_d = NULL;
	int32_t *y = NULL;
	float *logits = NULL;
	struct kiln_plan *p = NULL;
	struct kiln_tensor_desc sd, ld;
	if ((st = kiln_trained_open(cfg, reg, NULL, "evaluating", 0, &t)))
		return fail_st(st);
	const size_t xb = (size_t)rows * kiln_tensor_bytes(&t.sample);
	struct kiln_plan_opts o = { .keep_all = 1 };
	const int out_layer = t.m->layers[t.m->loss_layer].in[0];
	void *l_d;
	if ((st = read_batch(cfg, reg, rows, &x, &y, &sd)) ||
	    (st = kiln_device_alloc(t.dev, xb, &x_d)) ||
	    (st = kiln_device_alloc(t.dev, (size_t)rows * sizeof(int32_t) * 4096, &y_d)) ||
	    (st = kiln_device_alloc(t.dev, 64, &metrics_d)) ||
	    (st = kiln_device_copy_async(t.dev, x_d, x, xb, KILN_COPY_H2D, t.stream)) ||
	    (st = kiln_device_copy_async(t.dev, y_d, y, (size_t)rows * sizeof(int32_t),
					 KILN_COPY_H2D, t.stream)) ||
	    (st = kiln_model_plan_ex(t.m, rows, &o, &p)) ||
	    (st = kiln_plan_forward(p, x_d, y_d, metrics_d, t.stream)) ||
	    (st = kiln_device_stream_sync(t.dev, t.stream)) ||
	    (st = kiln_plan_tensor(p, t.m->layers[out_layer].name, "y", &l_d, &ld)))
		goto out;
	if (!(logits = malloc(kiln_tensor_bytes(&ld)))) {
		st = KILN_ENOMEM;
		goto out;
	}
	if ((st = kiln_device_copy_async(t.dev, logits, l_d, kiln_tensor_bytes(&ld), KILN_COPY_D2H,
					 t.stream)) ||
	    (st = kiln_device_stream_sync(t.dev, t.stream)) ||
	    ((io.quantized || infer) && (st = infer_logits(cfg, reg, rows, x, io.quantized, logits))))
		goto out;
	char path[4096];
	snprintf(path, sizeof path, "%s.shape", out);
	FILE *f = fopen(path, "w");
	if (!f) {
		st = kiln_error(KILN_EIO, "%s: cannot write", path);
		goto out;
	}
	fprintf(f, "x:%s %lld", t.sample.dtype == KILN_I32 ? "i32" : "f32", (long long)rows);
	for (int d = 0; d < t.sample.ndim; d++)
		fprintf(f, " %lld", (long long)t.sample.dims[d]);
	fprintf(f, "\nlogits:");
	for (int d = 0; d < ld.ndim; d++)
		fprintf(f, " %lld", (long long)ld.dims[d]);
	fprintf(f, "\n");
	fclose(f);
	if (write_raw(out, t.sample.dtype == KILN_I32 ? "x.i32" : "x.f32", x, xb) ||
	    write_raw(out, "logits.f32", logits, kiln_tensor_bytes(&ld))) {
		st = KILN_EIO;
		goto out;
	}
	double median, cpu;
	if (R > 0 && !(st = time_infer(cfg, reg, rows, x, &io, R, &median, &cpu)))
		printf("kiln_ms %.3f\nkiln_cpu_ms %.3f\n", median, cpu);
out:
	if (p)
		kiln_plan_free(p);
	kiln_device_free(t.dev, x_d);
	kiln_device_free(t.dev, y_d);
	kiln_device_free(t.dev, metrics_d);
	kiln_trained_close(&t);
	kiln_registry_close(reg);
	kiln_config_free(cfg);
	free(x);
	free(y);
	free(logits);
	return st ? fail_st(st) : 0;
}

int main(int argc, char **argv)
{
	if (argc >= 2 && !strcmp(argv[1], "dump"))
		return cmd_dump(argc, argv);
	if (argc >= 2 && !strcmp(argv[1], "logits"))
		return cmd_logits(argc, argv);
	return fail("usage: onnx_tool dump MODEL.onnx [WEIGHTS] | logits CONFIG ROWS OUT [--time R]");
}
