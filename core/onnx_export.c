/* core/onnx_export.c - `kiln export CONFIG --onnx FILE` (docs/inference.md):
 * the evaluation graph of a trained model as an ONNX model, fp32, packed by
 * protobuf-c from the ONNX schema (libonnx-dev's onnx.proto, compiled by
 * protoc-c at build time).  ONNX 1.12: IR version 8, opset 17 (default
 * domain).
 *
 * The graph: one input "input" ([N, sample...]: f32 as the model reads it
 * after [data]'s transforms, NCHW for images whatever [model] layout; i32
 * token ids), the layers in order (core/onnx_layers.c) up to the loss
 * layer, whose input is the one output "logits" ([N, ...], no softmax: what
 * `kiln eval` computes the loss from).  Weights are initializers under
 * kiln's (and PyTorch's) names and layouts, "fc1.weight", "bn1.running_var".
 *
 * Quantized models (`kiln export --onnx F --quantized Q`, the INT8 model
 * of `kiln quantize`): the folded model with Q's weights, in the QDQ
 * format: every INT8 conv/linear ([layer.X] int8_scale > 0) reads its input
 * through QuantizeLinear/DequantizeLinear with the layer's calibrated scale
 * (u8 or i8, zero point 0) and its weight as an int8 initializer through
 * DequantizeLinear with per-output-channel scales (axis 0): exactly the
 * operands KILN_OP_QCONV/QLINEAR quantize (core/onnx_layers.c, qdq_*).
 */
#include "build-config.h"
#include "graph.h"

#ifndef KILN_HAVE_ONNX

kiln_status kiln_export_onnx(const struct kiln_config *cfg, const struct kiln_registry *reg,
			     const char *checkpoint, const char *path)
{
	(void)cfg, (void)reg, (void)checkpoint;
	return kiln_error(KILN_ENOTSUP, "%s: this kiln was built without ONNX export: install libonnx-dev (onnx.proto), then configure and build again",
			  path);
}

kiln_status kiln_export_onnx_quantized(const struct kiln_config *cfg,
				       const struct kiln_registry *reg, const char *quantized,
				       const char *path)
{
	(void)quantized;
	return kiln_export_onnx(cfg, reg, NULL, path);
}

#else

#include "onnx_export.h"
#include "infer_passes.h"

#include <kiln/infer.h>

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the graph's memory ----------------------------------------------------- */

void *onnx_alloc(struct onnx_graph *g, size_t n)
{
	if (g->n_allocs == g->alloc_cap) {
		size_t cap = g->alloc_cap ? 2 * g->alloc_cap : 256;
		void **a = realloc(g->allocs, cap * sizeof *a);
		if (!a) {
			g->oom = 1;
			return NULL;
		}
		g->allocs = a, g->alloc_cap = cap;
	}
	void *p = calloc(1, n ? n : 1);
	if (!p)
		g->oom = 1;
	else
		g->allocs[g->n_allocs++] = p;
	return p;
}

char *onnx_str(struct onnx_graph *g, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(NULL, 0, fmt, ap);
	va_end(ap);
	char *s = n >= 0 ? onnx_alloc(g, (size_t)n + 1) : NULL;
	if (s) {
		va_start(ap, fmt);
		vsnprintf(s, (size_t)n + 1, fmt, ap);
		va_end(ap);
	}
	return s ? s : "";
}

/* Append p to a growing array of pointers (*arr, *n, *cap). */
static void push(struct onnx_graph *g, void ***arr, size_t *n, size_t *cap, void *p)
{
	if (*n == *cap) {
		size_t c = *cap ? 2 * *cap : 64;
		void **a = onnx_alloc(g, c * sizeof *a);
		if (!a)
			return;
		if (*n)
			memcpy(a, *arr, *n * sizeof *a);
		*arr = a, *cap = c; /* the old array stays in allocs until the end */
	}
	(*arr)[(*n)++] = p;
}

/* ---- nodes and attributes ----------------------------------------------------- */

#define MAX_ATTRS 8

Onnx__NodeProto *onnx_node(struct onnx_graph *g, const char *op, const char *out, int n_in,
			   const char *const *in)
{
	static Onnx__NodeProto spare; /* what an out-of-memory graph writes into */
	Onnx__NodeProto *n = onnx_alloc(g, sizeof *n);
	char **ins = onnx_alloc(g, sizeof(char *) * (size_t)(n_in > 0 ? n_in : 1));
	char **outs = onnx_alloc(g, sizeof(char *));
	Onnx__AttributeProto **attrs = onnx_alloc(g, sizeof *attrs * MAX_ATTRS);
	if (!n || !ins || !outs || !attrs) {
		memset(&spare, 0, sizeof spare);
		return &spare;
	}
	onnx__node_proto__init(n);
	for (int k = 0; k < n_in; k++)
		ins[k] = (char *)(in[k] ? in[k] : "");
	outs[0] = (char *)out;
	n->n_input = (size_t)n_in, n->input = ins;
	n->n_output = 1, n->output = outs;
	n->name = (char *)out;
	n->op_type = (char *)op;
	n->attribute = attrs;
	push(g, (void ***)&g->g->node, &g->g->n_node, &g->node_cap, n);
	return n;
}

static Onnx__AttributeProto *attr(struct onnx_graph *g, Onnx__NodeProto *n, const char *name,
				  Onnx__AttributeProto__AttributeType type)
{
	Onnx__AttributeProto *a = onnx_alloc(g, sizeof *a);
	if (!a || !n->attribute || n->n_attribute >= MAX_ATTRS) {
		g->oom |= a && n->attribute; /* a kiln bug: more than MAX_ATTRS */
		return NULL;
	}
	onnx__attribute_proto__init(a);
	a->name = (char *)name;
	a->has_type = 1, a->type = type;
	n->attribute[n->n_attribute++] = a;
	return a;
}

void onnx_attr_int(struct onnx_graph *g, Onnx__NodeProto *n, const char *name, int64_t v)
{
	Onnx__AttributeProto *a = attr(g, n, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT);
	if (a)
		a->has_i = 1, a->i = v;
}

void onnx_attr_ints(struct onnx_graph *g, Onnx__NodeProto *n, const char *name, int count,
		    const int64_t *v)
{
	Onnx__AttributeProto *a = attr(g, n, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS);
	int64_t *copy = onnx_alloc(g, sizeof(int64_t) * (size_t)count);
	if (!a || !copy)
		return;
	memcpy(copy, v, sizeof(int64_t) * (size_t)count);
	a->n_ints = (size_t)count, a->ints = copy;
}

void onnx_attr_float(struct onnx_graph *g, Onnx__NodeProto *n, const char *name, float v)
{
	Onnx__AttributeProto *a = attr(g, n, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT);
	if (a)
		a->has_f = 1, a->f = v;
}

/* ---- initializers ----------------------------------------------------------- */

/* An initializer `name` of dtype, dims[ndim], raw little-endian bytes
 * (kept, not copied: they live as long as the graph). */
static const char *initializer(struct onnx_graph *g, const char *name, int dtype, int ndim,
			       const int64_t *dims, const void *bytes, size_t nbytes)
{
	Onnx__TensorProto *t = onnx_alloc(g, sizeof *t);
	int64_t *d = onnx_alloc(g, sizeof(int64_t) * (size_t)(ndim > 0 ? ndim : 1));
	if (!t || !d)
		return name;
	onnx__tensor_proto__init(t);
	if (ndim)
		memcpy(d, dims, sizeof(int64_t) * (size_t)ndim);
	t->n_dims = (size_t)ndim, t->dims = d;
	t->has_data_type = 1, t->data_type = dtype;
	t->name = (char *)name;
	t->has_raw_data = 1;
	t->raw_data.len = nbytes, t->raw_data.data = (uint8_t *)bytes;
	push(g, (void ***)&g->g->initializer, &g->g->n_initializer, &g->init_cap, t);
	return name;
}

static size_t count(int ndim, const int64_t *dims)
{
	size_t n = 1;
	for (int d = 0; d < ndim; d++)
		n *= (size_t)dims[d];
	return n;
}

/* A constant's values, copied into the graph's memory. */
static const char *constant(struct onnx_graph *g, const char *name, int dtype, size_t elem,
			    int ndim, const int64_t *dims, const void *v)
{
	const size_t bytes = elem * count(ndim, dims);
	void *copy = onnx_alloc(g, bytes);
	if (copy && v)
		memcpy(copy, v, bytes);
	return initializer(g, name, dtype, ndim, dims, copy, bytes);
}

const char *onnx_const_i64(struct onnx_graph *g, const char *name, int ndim,
			   const int64_t *dims, const int64_t *v)
{
	return constant(g, name, ONNX__TENSOR_PROTO__DATA_TYPE__INT64, sizeof *v, ndim, dims, v);
}

const char *onnx_const_f32(struct onnx_graph *g, const char *name, int ndim,
			   const int64_t *dims, const float *v)
{
	return constant(g, name, ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, sizeof *v, ndim, dims, v);
}

const char *onnx_const_bool(struct onnx_graph *g, const char *name, int ndim,
			    const int64_t *dims, const uint8_t *v)
{
	return constant(g, name, ONNX__TENSOR_PROTO__DATA_TYPE__BOOL, 1, ndim, dims, v);
}

const char *onnx_const_i8(struct onnx_graph *g, const char *name, int is_unsigned, int ndim,
			  const int64_t *dims, const void *v)
{
	return constant(g, name, is_unsigned ? ONNX__TENSOR_PROTO__DATA_TYPE__UINT8
					     : ONNX__TENSOR_PROTO__DATA_TYPE__INT8,
			1, ndim, dims, v);
}

/* ---- the seams of a quantized export ----------------------------------------- */

/* The value nodes read for model parameter p: its fp32 initializer, or an
 * INT8 layer's weight dequantized (onnx_layers.c's qdq_weight). */
static const char *onnx_weight_value(struct onnx_graph *g, int p)
{
	const struct model_param *mp = &g->m->params[p];
	const char *dq = onnx_int8_weight(g, p);
	if (dq)
		return dq;
	if (!g->emitted[p]) {
		g->emitted[p] = 1;
		initializer(g, mp->name, ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, mp->desc.ndim,
			    mp->desc.dims, (mp->buffer ? g->buffers : g->params) + mp->off,
			    sizeof(float) * (size_t)mp->numel);
	}
	return mp->name;
}

/* The value layer i's readers read: its output.  (A quantized export
 * quantizes where the INT8 layers read it: onnx_layers.c's qdq_input.) */
static const char *onnx_activation_value(struct onnx_graph *g, int i)
{
	return g->value[i];
}

const char *onnx_param(struct onnx_graph *g, int i, const char *suffix)
{
	const struct model_layer *L = &g->m->layers[i];
	for (int k = 0; k < L->n_params; k++)
		if (!strcmp(g->nodes[i].l.params[k].suffix, suffix))
			return onnx_weight_value(g, L->pidx[k]);
	return NULL;
}

/* ---- the graph's input and output ------------------------------------------- */

/* A value_info `name` of elem type and shape [N, dims[1..ndim)) with the
 * batch dimension named "N". */
static Onnx__ValueInfoProto *value_info(struct onnx_graph *g, const char *name, int elem,
					const struct kiln_tensor_desc *d)
{
	Onnx__ValueInfoProto *v = onnx_alloc(g, sizeof *v);
	Onnx__TypeProto *t = onnx_alloc(g, sizeof *t);
	Onnx__TypeProto__Tensor *tt = onnx_alloc(g, sizeof *tt);
	Onnx__TensorShapeProto *s = onnx_alloc(g, sizeof *s);
	Onnx__TensorShapeProto__Dimension **dims = onnx_alloc(g, sizeof *dims * KILN_MAX_DIMS);
	if (!v || !t || !tt || !s || !dims)
		return NULL;
	onnx__value_info_proto__init(v);
	onnx__type_proto__init(t);
	onnx__type_proto__tensor__init(tt);
	onnx__tensor_shape_proto__init(s);
	for (int k = 0; k < d->ndim; k++) {
		Onnx__TensorShapeProto__Dimension *dim = onnx_alloc(g, sizeof *dim);
		if (!dim)
			return NULL;
		onnx__tensor_shape_proto__dimension__init(dim);
		if (k == 0) {
			dim->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM;
			dim->dim_param = "N";
		} else {
			dim->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
			dim->dim_value = d->dims[k];
		}
		dims[k] = dim;
	}
	s->n_dim = (size_t)d->ndim, s->dim = dims;
	tt->has_elem_type = 1, tt->elem_type = elem, tt->shape = s;
	t->value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE, t->tensor_type = tt;
	v->name = (char *)name, v->type = t;
	return v;
}

/* The layer whose output is the graph's: what the loss layer reads, or
 * the last layer of a model without one. */
static int output_layer(const struct kiln_model *m)
{
	if (m->loss_layer >= 0)
		return m->layers[m->loss_layer].in[0];
	return m->n_layers - 1;
}

/* ---- the model ---------------------------------------------------------------- */

/* Layer i's value must have kiln's shape of its output, at batch 1
 * (kiln_onnx_check, before the file is written). */
static void expect_layer(struct onnx_graph *g, int i)
{
	const struct kiln_tensor_desc *d = &g->nodes[i].l.out;
	if (!g->expect || d->ndim > ONNX_CHECK_MAX_DIMS)
		return;
	struct kiln_onnx_expect *e = &g->expect[g->n_expect++];
	e->value = g->value[i];
	e->layer = g->m->layers[i].name;
	e->elem_type = d->dtype == KILN_F32 ? ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT : 0;
	e->ndim = d->ndim;
	memcpy(e->dims, d->dims, sizeof(int64_t) * (size_t)d->ndim);
}

/* Every layer but the losses, then the input and output; g->nodes
 * inferred, g->params and g->buffers filled. */
static kiln_status build_graph(struct onnx_graph *g)
{
	const struct kiln_model *m = g->m;
	const int out = output_layer(m);
	if (out < 0)
		return kiln_error(KILN_ECONFIG, "the model has no layer before its loss: nothing to export");
	g->input = "input";
	for (int i = 0; i < m->n_layers; i++) {
		if (g->nodes[i].l.is_loss)
			continue;
		kiln_status st = onnx_emit_layer(g, i);
		if (st)
			return st;
		g->value[i] = onnx_activation_value(g, i);
		expect_layer(g, i);
	}
	struct kiln_tensor_desc in;
	kiln_model_data_desc(m, 1, &in);
	const int in_i32 = in.dtype == KILN_I32;
	const char *y = "logits";
	const char *x = g->value[out];
	if (strcmp(x, y)) /* unless the layer is named so */
		onnx_node(g, "Identity", y, 1, &x);
	Onnx__ValueInfoProto *vin = value_info(g, g->input, in_i32 ? ONNX__TENSOR_PROTO__DATA_TYPE__INT32
							   : ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, &in);
	Onnx__ValueInfoProto *vout = value_info(g, y, ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT,
						&g->nodes[out].l.out);
	Onnx__ValueInfoProto **ins = onnx_alloc(g, sizeof *ins), **outs = onnx_alloc(g, sizeof *outs);
	if (g->oom || !vin || !vout || !ins || !outs)
		return kiln_error(KILN_ENOMEM, "out of memory building the ONNX graph");
	ins[0] = vin, outs[0] = vout;
	g->g->n_input = 1, g->g->input = ins;
	g->g->n_output = 1, g->g->output = outs;
	return KILN_OK;
}

/* The model's parameters and buffers in host memory (g->params, g->buffers). */
static kiln_status host_weights(struct onnx_graph *g, struct kiln_model *m, void *stream)
{
	float *p = onnx_alloc(g, sizeof(float) * (m->n_elems + 1));
	float *b = onnx_alloc(g, sizeof(float) * (m->n_buf_elems + 1));
	if (!p || !b)
		return kiln_error(KILN_ENOMEM, "out of memory copying the weights");
	kiln_status st;
	if ((m->n_elems && (st = kiln_device_copy_async(m->dev, p, m->params_d,
							m->n_elems * sizeof(float),
							KILN_COPY_D2H, stream))) ||
	    (m->n_buf_elems && (st = kiln_device_copy_async(m->dev, b, m->buffers_d,
							    m->n_buf_elems * sizeof(float),
							    KILN_COPY_D2H, stream))) ||
	    (st = kiln_device_stream_sync(m->dev, stream)))
		return st;
	g->params = p, g->buffers = b;
	return KILN_OK;
}

/* The packed model's bytes, for kiln_file_write. */
struct packed {
	const uint8_t *buf;
	size_t n;
};

static int fill_packed(FILE *fp, void *ctx)
{
	const struct packed *p = ctx;
	return fwrite(p->buf, 1, p->n, fp) == p->n ? 0 : errno ? errno : EIO;
}

/* Pack the model and write it to path. */
static kiln_status write_model(struct onnx_graph *g, const char *path)
{
	Onnx__ModelProto model = ONNX__MODEL_PROTO__INIT;
	Onnx__OperatorSetIdProto opset = ONNX__OPERATOR_SET_ID_PROTO__INIT;
	Onnx__OperatorSetIdProto *opsets[1] = { &opset };
	opset.domain = "";
	opset.has_version = 1, opset.version = KILN_ONNX_OPSET;
	model.has_ir_version = 1, model.ir_version = KILN_ONNX_IR_VERSION;
	model.n_opset_import = 1, model.opset_import = opsets;
	model.producer_name = "kiln";
	model.producer_version = (char *)kiln_version();
	model.graph = g->g;
	const size_t n = onnx__model_proto__get_packed_size(&model);
	if (n > ((size_t)2 << 30) - 1)
		return kiln_error(KILN_ENOTSUP, "%s: the model is %zu bytes, past protobuf's 2 GiB (ONNX external data is not written)",
				  path, n);
	uint8_t *buf = malloc(n ? n : 1);
	if (!buf)
		return kiln_error(KILN_ENOMEM, "%s: out of memory packing %zu bytes", path, n);
	onnx__model_proto__pack(&model, buf);
	/* the bytes read back and checked before any is written: a mapping
	 * that ONNX's shape rules or kiln's own shapes refute fails here,
	 * naming the node, not later in a runtime (before session 32 only
	 * tests/onnx_ort.sh, skipped in CI, would have seen it) */
	kiln_status st = kiln_onnx_check(buf, n, g->expect, g->n_expect);
	if (st) {
		free(buf);
		return st;
	}
	/* through path.kiln-tmp<pid>.<n>, fsynced, renamed over path: a failed write
	 * leaves no partial model and keeps an earlier export whole (before
	 * session 31 it was truncated, then removed) */
	struct packed p = { buf, n };
	const int err = kiln_file_write(path, fill_packed, &p);
	free(buf);
	if (err)
		return kiln_error(KILN_EIO, "%s: cannot write: %s", path, strerror(err));
	return KILN_OK;
}

static void graph_free(struct onnx_graph *g)
{
	for (size_t k = 0; k < g->n_allocs; k++)
		free(g->allocs[k]);
	free(g->allocs);
}

/* Export model m (weights loaded) to path. */
static kiln_status export_model(struct kiln_model *m, void *stream, const char *path)
{
	struct onnx_graph g;
	Onnx__GraphProto graph = ONNX__GRAPH_PROTO__INIT;
	memset(&g, 0, sizeof g);
	g.g = &graph;
	g.m = m;
	graph.name = "kiln";
	struct plan_node *nodes = calloc((size_t)m->n_layers, sizeof *nodes);
	g.emitted = onnx_alloc(&g, (size_t)m->n_params + 1);
	g.value = onnx_alloc(&g, sizeof(char *) * (size_t)m->n_layers);
	g.expect = onnx_alloc(&g, sizeof *g.expect * (size_t)m->n_layers);
	if (!nodes || g.oom) {
		free(nodes);
		graph_free(&g);
		return kiln_error(KILN_ENOMEM, "out of memory exporting %s", path);
	}
	/* the layers' shapes and parameter slots, as a plan of batch 1 has them */
	struct kiln_tensor_desc data;
	kiln_model_data_desc(m, 1, &data);
	g.nodes = nodes;
	kiln_status st = kiln_model_infer(m, &data, 0, KILN_FUSE_NONE, nodes);
	if (!st && !(st = host_weights(&g, m, stream)) && !(st = build_graph(&g)))
		st = write_model(&g, path);
	if (st)
		st = kiln_error_wrap(st, "%s: ONNX export", path);
	for (int i = 0; i < m->n_layers; i++)
		kiln_plan_node_free(&nodes[i], NULL);
	free(nodes);
	graph_free(&g);
	return st;
}

kiln_status kiln_export_onnx(const struct kiln_config *cfg, const struct kiln_registry *reg,
			     const char *checkpoint, const char *path)
{
	if (!cfg || !reg || !path)
		return kiln_null_arg("kiln_export_onnx", !cfg ? "cfg" : !reg ? "reg" : "path");
	struct kiln_trained t;
	const char *in[2] = { checkpoint, kiln_config_get(cfg, "model", "init_from") };
	kiln_status st = kiln_output_check(path, in, 2);
	if (st || (st = kiln_trained_open(cfg, reg, checkpoint, "exporting", 0, &t)))
		return st;
	if (!(st = export_model(t.m, t.stream, path)))
		kiln_log(KILN_LOG_DEBUG, "core", "wrote %s: ONNX IR %d, opset %d",
			 path, KILN_ONNX_IR_VERSION, KILN_ONNX_OPSET);
	kiln_trained_close(&t);
	return st;
}

kiln_status kiln_export_onnx_quantized(const struct kiln_config *cfg,
				       const struct kiln_registry *reg, const char *quantized,
				       const char *path)
{
	if (!cfg || !reg || !quantized || !path)
		return kiln_null_arg("kiln_export_onnx_quantized", !cfg ? "cfg" : !reg ? "reg" : !quantized ? "quantized" : "path");
	const struct kiln_infer_opts o = { .batch = 1, .quantized = quantized };
	struct kiln_infer *im;
	void *stream;
	/* with no weights file, kiln_infer_open leaves the config as it is */
	kiln_status st = kiln_output_check(path, &quantized, 1);
	if (st || (st = kiln_infer_open((struct kiln_config *)cfg, reg, NULL, &o, &im)))
		return st;
	struct kiln_model *m = kiln_infer_model(im, &stream);
	if (!(st = export_model(m, stream, path)))
		kiln_log(KILN_LOG_DEBUG, "core", "wrote %s: ONNX IR %d, opset %d, QDQ INT8 of %s",
			 path, KILN_ONNX_IR_VERSION, KILN_ONNX_OPSET, quantized);
	kiln_infer_free(im);
	return st;
}

#endif /* KILN_HAVE_ONNX */
