/* core/onnx_check.h - kiln's own check of an exported ONNX model
 * (core/onnx_check.c, the operators' shape rules in core/onnx_check_ops.c):
 * the packed bytes, read back with protobuf-c before they are written,
 * every node's inputs defined before use, every initializer's bytes its
 * dtype and shape, each node's output shape inferred by ONNX's rules for
 * the operators kiln emits, and the value of each layer equal in shape to
 * kiln's tensor.  Before session 32 a mapping bug (a Concat on the wrong
 * axis) passed every structural test; only ONNX Runtime, skipped in CI,
 * would have failed.  Only with KILN_HAVE_ONNX. */
#ifndef KILN_ONNX_CHECK_H
#define KILN_ONNX_CHECK_H

#include <kiln/kiln.h>
#include "core/proto/onnx.pb-c.h"

#include <stddef.h>
#include <stdint.h>

/* Ranks the checker follows (kiln's attention reaches 5). */
#define ONNX_CHECK_MAX_DIMS 8

/* A layer's value as kiln computes it, at batch 1: the graph's value
 * `value` must have this shape (and elem_type, an ONNX
 * TensorProto.DataType; 0: any).  Strings borrowed for the call. */
struct kiln_onnx_expect {
	const char *value;  /* the ONNX value name */
	const char *layer;  /* kiln's layer, for the message */
	int elem_type;
	int ndim;
	int64_t dims[ONNX_CHECK_MAX_DIMS];
};

/* Check the packed ModelProto buf[n] (borrowed) against exp[n_exp]:
 * KILN_OK, else KILN_EINTERNAL (a mapping bug in core/onnx_layers.c)
 * whose message names the node, its op and what is wrong.  The graph's
 * symbolic dimensions (the batch "N") are taken as 1.  Any thread. */
kiln_status kiln_onnx_check(const void *buf, size_t n, const struct kiln_onnx_expect *exp,
			    size_t n_exp);

/* ---- what the driver and the rules share (core/onnx_check_ops.c) ---- */

/* A value of the graph: its elem type and shape; an initializer's tensor
 * (its data: Reshape's shape, Slice's starts) when it is one. */
struct onnx_val {
	const char *name;
	int dtype; /* TensorProto.DataType */
	int ndim;
	int64_t dims[ONNX_CHECK_MAX_DIMS];
	const Onnx__TensorProto *init;
};

/* One operator's rule: its inputs in[0..n_in) (NULL: an omitted optional
 * input, "") to its output's type and shape in *out; KILN_OK or
 * KILN_EINTERNAL saying what is wrong (the caller names the node). */
typedef kiln_status (*onnx_rule_fn)(const Onnx__NodeProto *n, const struct onnx_val *const *in,
				    int n_in, struct onnx_val *out);

struct onnx_rule {
	const char *op;
	/* inputs below min_in must be given; those from min_in on are
	 * optional (an empty name: omitted, in[k] NULL), except a variadic
	 * operator's (max_in ONNX_RULE_MANY), which ONNX does not let omit */
	int min_in, max_in;
	onnx_rule_fn infer;
};
#define ONNX_RULE_MANY (1 << 20)

/* The rule of ONNX operator `op` (default domain, opset 17), NULL when
 * the checker has none: a new operator in onnx_layers.c needs a rule. */
const struct onnx_rule *onnx_check_rule(const char *op);

/* "f32[1, 8, 4, 4]" into buf[size]. */
const char *onnx_val_str(const struct onnx_val *v, char *buf, size_t size);

#endif
