/* core/onnx_export.h - what core/onnx_export.c (the model, its graph and
 * the file) and core/onnx_layers.c (one kiln layer as ONNX nodes) share:
 * a graph under construction.  Only with KILN_HAVE_ONNX (configure found
 * libonnx-dev's onnx.proto and protoc-c compiled it). */
#ifndef KILN_ONNX_EXPORT_H
#define KILN_ONNX_EXPORT_H

#include "graph.h"
#include "core/proto/onnx.pb-c.h"
#include "onnx_check.h"

/* The opset and IR version written: ONNX 1.12's (libonnx-dev), opset 17
 * for LayerNormalization. */
#define KILN_ONNX_OPSET 17
#define KILN_ONNX_IR_VERSION 8

struct onnx_graph {
	Onnx__GraphProto *g;
	size_t node_cap, init_cap;
	void **allocs;               /* everything the messages point to */
	size_t n_allocs, alloc_cap;
	int oom;                     /* an allocation failed: the export fails */
	const struct kiln_model *m;
	const struct plan_node *nodes; /* the layers inferred for batch 1 */
	const float *params, *buffers; /* host copies of the model's */
	unsigned char *emitted;      /* per model_param: its initializer is in */
	const char **value;          /* per layer: the value its output is */
	const char *input;           /* the graph input's value name */
	struct kiln_onnx_expect *expect; /* per layer exported: kiln's shape */
	size_t n_expect;
};

/* Memory the graph owns (zeroed), freed with it; NULL sets g->oom. */
void *onnx_alloc(struct onnx_graph *g, size_t n);
char *onnx_str(struct onnx_graph *g, const char *fmt, ...) KILN_PRINTF(2, 3);
/* Append node `op` writing value `out` from n_in values (NULL: an omitted
 * optional input, written ""); the node is named after out. */
Onnx__NodeProto *onnx_node(struct onnx_graph *g, const char *op, const char *out, int n_in,
			   const char *const *in);
void onnx_attr_int(struct onnx_graph *g, Onnx__NodeProto *n, const char *name, int64_t v);
void onnx_attr_ints(struct onnx_graph *g, Onnx__NodeProto *n, const char *name, int count,
		    const int64_t *v);
void onnx_attr_float(struct onnx_graph *g, Onnx__NodeProto *n, const char *name, float v);
/* Constant initializers named `name`: i64 (shapes, axes, indices), f32,
 * bool; dims[ndim] (ndim 0: a scalar). */
const char *onnx_const_i64(struct onnx_graph *g, const char *name, int ndim,
			   const int64_t *dims, const int64_t *v);
const char *onnx_const_f32(struct onnx_graph *g, const char *name, int ndim,
			   const int64_t *dims, const float *v);
const char *onnx_const_bool(struct onnx_graph *g, const char *name, int ndim,
			    const int64_t *dims, const uint8_t *v);
/* 8-bit integers (a quantized export): u8 when is_unsigned, else i8. */
const char *onnx_const_i8(struct onnx_graph *g, const char *name, int is_unsigned, int ndim,
			  const int64_t *dims, const void *v);
/* The value a node reads for parameter `suffix` ("weight", "running_mean")
 * of layer i: its initializer, named as kiln and PyTorch name it
 * ("fc1.weight"; a tied weight by its owner's name), written once; NULL
 * when the layer has no such parameter.  Every weight goes through here:
 * it is where a quantized export inserts DequantizeLinear (see
 * onnx_export.c, onnx_weight_value). */
const char *onnx_param(struct onnx_graph *g, int i, const char *suffix);

/* core/onnx_layers.c.  Append layer i's nodes, reading g->value[] of its
 * inputs, and set g->value[i]; KILN_ECONFIG naming the layer, its type
 * and its config line for a layer ONNX has no mapping for. */
kiln_status onnx_emit_layer(struct onnx_graph *g, int i);
/* The value an fp32 node reads for parameter p when it is an INT8 layer's
 * weight (a weight tied to one): its DequantizeLinear, as kiln loading the
 * quantized file dequantizes it for every reader; else NULL. */
const char *onnx_int8_weight(struct onnx_graph *g, int p);

#endif
