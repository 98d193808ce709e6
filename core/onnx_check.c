/* core/onnx_check.c - the exported model read back and checked
 * (core/onnx_check.h): the driver.  It walks the graph as a runtime would
 * load it: the initializers (their bytes as long as their dtype and
 * shape say), the graph's inputs, then each node in order, its inputs
 * already defined, its output's shape inferred by the operator's rule
 * (core/onnx_check_ops.c) and, where the value is a kiln layer's, equal to
 * kiln's tensor; last the graph's outputs as declared.  The first fault
 * fails the export, naming the node: a mapping that breaks ONNX's rules or
 * disagrees with kiln is caught before the file is written.
 */
#include "build-config.h"

#ifdef KILN_HAVE_ONNX

#include "onnx_check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- values by name: open addressing over a power-of-two table ------------- */

struct vtab {
	struct onnx_val *v; /* the values, in definition order */
	size_t n, cap;
	int *slot;          /* index into v, -1 empty */
	size_t mask;
};

static size_t hash(const char *s)
{
	size_t h = 1469598103934665603ull; /* FNV-1a */
	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 1099511628211ull;
	return h;
}

static int vtab_init(struct vtab *t, size_t cap)
{
	size_t size = 64;
	while (size < 2 * cap)
		size *= 2;
	t->v = calloc(cap ? cap : 1, sizeof *t->v);
	t->slot = malloc(size * sizeof *t->slot);
	t->n = 0, t->cap = cap, t->mask = size - 1;
	if (!t->v || !t->slot)
		return -1;
	memset(t->slot, 0xff, size * sizeof *t->slot);
	return 0;
}

static void vtab_free(struct vtab *t)
{
	free(t->v);
	free(t->slot);
}

static struct onnx_val *vtab_get(const struct vtab *t, const char *name)
{
	for (size_t h = hash(name) & t->mask;; h = (h + 1) & t->mask) {
		if (t->slot[h] < 0)
			return NULL;
		if (!strcmp(t->v[t->slot[h]].name, name))
			return &t->v[t->slot[h]];
	}
}

/* Define v (its name new: the caller checked); NULL when full (a bug). */
static struct onnx_val *vtab_add(struct vtab *t, const struct onnx_val *v)
{
	if (t->n == t->cap)
		return NULL;
	size_t h = hash(v->name) & t->mask;
	while (t->slot[h] >= 0)
		h = (h + 1) & t->mask;
	t->slot[h] = (int)t->n;
	t->v[t->n] = *v;
	return &t->v[t->n++];
}

/* ---- shapes as text ---------------------------------------------------------- */

static const char *elem_name(int dtype)
{
	switch (dtype) {
	case ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT: return "f32";
	case ONNX__TENSOR_PROTO__DATA_TYPE__UINT8: return "u8";
	case ONNX__TENSOR_PROTO__DATA_TYPE__INT8: return "i8";
	case ONNX__TENSOR_PROTO__DATA_TYPE__INT32: return "i32";
	case ONNX__TENSOR_PROTO__DATA_TYPE__INT64: return "i64";
	case ONNX__TENSOR_PROTO__DATA_TYPE__BOOL: return "bool";
	default: return NULL;
	}
}

const char *onnx_val_str(const struct onnx_val *v, char *buf, size_t size)
{
	const char *e = elem_name(v->dtype);
	size_t k = (size_t)snprintf(buf, size, "%s[", e ? e : "?");
	for (int d = 0; d < v->ndim && k < size; d++)
		k += (size_t)snprintf(buf + k, size - k, "%s%lld", d ? ", " : "",
				      (long long)v->dims[d]);
	if (k < size)
		snprintf(buf + k, size - k, "]");
	return buf;
}

/* ---- the initializers and the graph's inputs --------------------------------- */

static size_t elem_size(int dtype)
{
	switch (dtype) {
	case ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT:
	case ONNX__TENSOR_PROTO__DATA_TYPE__INT32: return 4;
	case ONNX__TENSOR_PROTO__DATA_TYPE__INT64: return 8;
	case ONNX__TENSOR_PROTO__DATA_TYPE__UINT8:
	case ONNX__TENSOR_PROTO__DATA_TYPE__INT8:
	case ONNX__TENSOR_PROTO__DATA_TYPE__BOOL: return 1;
	default: return 0;
	}
}

/* The number of elements a typed field holds (no raw_data). */
static size_t typed_count(const Onnx__TensorProto *t)
{
	switch (t->data_type) {
	case ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT: return t->n_float_data;
	case ONNX__TENSOR_PROTO__DATA_TYPE__INT64: return t->n_int64_data;
	default: return t->n_int32_data; /* int32, int8, uint8, bool */
	}
}

/* Initializer t as a value: a known dtype, a rank the checker follows,
 * no negative dimension, and exactly its shape's bytes. */
static kiln_status init_val(const Onnx__TensorProto *t, struct onnx_val *v)
{
	const char *name = t->name ? t->name : "";
	if (!*name)
		return kiln_error(KILN_EINTERNAL, "an initializer has no name");
	const size_t es = elem_size(t->data_type);
	if (!es)
		return kiln_error(KILN_EINTERNAL, "initializer '%s': data type %d is none kiln writes",
				  name, (int)t->data_type);
	if (t->n_dims > ONNX_CHECK_MAX_DIMS)
		return kiln_error(KILN_EINTERNAL, "initializer '%s': %zu dimensions", name, t->n_dims);
	memset(v, 0, sizeof *v);
	v->name = name, v->dtype = t->data_type, v->ndim = (int)t->n_dims, v->init = t;
	size_t count = 1;
	for (size_t d = 0; d < t->n_dims; d++) {
		if (t->dims[d] < 0)
			return kiln_error(KILN_EINTERNAL, "initializer '%s': dimension %zu is %lld",
					  name, d, (long long)t->dims[d]);
		v->dims[d] = t->dims[d];
		/* a count, or its bytes, past size_t would wrap to a small number
		 * the data could match (dims [2^61] of i64: 0 bytes), and the
		 * rules that read the data (indices_in_range) read past it */
		if ((uint64_t)t->dims[d] > SIZE_MAX ||
		    (t->dims[d] && count > SIZE_MAX / (size_t)t->dims[d]))
			return kiln_error(KILN_EINTERNAL, "initializer '%s': dimensions of more than %zu elements",
					  name, SIZE_MAX);
		count *= (size_t)t->dims[d];
	}
	if (count > SIZE_MAX / es)
		return kiln_error(KILN_EINTERNAL, "initializer '%s': %zu elements of %zu bytes, more than %zu bytes",
				  name, count, es, SIZE_MAX);
	char s[160];
	if (t->has_raw_data ? t->raw_data.len != count * es : typed_count(t) != count)
		return kiln_error(KILN_EINTERNAL, "initializer '%s': %s needs %zu bytes, it holds %zu",
				  name, onnx_val_str(v, s, sizeof s), count * es,
				  t->has_raw_data ? t->raw_data.len : typed_count(t) * es);
	return KILN_OK;
}

/* A value_info (an input or output of the graph) as a value: symbolic
 * dimensions (the batch) are 1, as kiln's shapes are at batch 1. */
static kiln_status info_val(const Onnx__ValueInfoProto *vi, struct onnx_val *v)
{
	const char *name = vi->name ? vi->name : "";
	const Onnx__TypeProto__Tensor *tt =
		vi->type && vi->type->value_case == ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE
			? vi->type->tensor_type : NULL;
	if (!*name || !tt || !tt->shape || tt->shape->n_dim > ONNX_CHECK_MAX_DIMS)
		return kiln_error(KILN_EINTERNAL, "graph input or output '%s': no tensor type of a known shape",
				  name);
	memset(v, 0, sizeof *v);
	v->name = name, v->dtype = tt->elem_type, v->ndim = (int)tt->shape->n_dim;
	for (int d = 0; d < v->ndim; d++) {
		const Onnx__TensorShapeProto__Dimension *dim = tt->shape->dim[d];
		v->dims[d] = dim->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE
				     ? dim->dim_value : 1;
		/* (a huge one is caught by the operators' checked arithmetic) */
		if (v->dims[d] < 0)
			return kiln_error(KILN_EINTERNAL, "graph input or output '%s': dimension %d is %lld",
					  name, d, (long long)v->dims[d]);
	}
	return KILN_OK;
}

static int same_shape(const struct onnx_val *a, int dtype, int ndim, const int64_t *dims)
{
	if ((dtype && a->dtype != dtype) || a->ndim != ndim)
		return 0;
	for (int d = 0; d < ndim; d++)
		if (a->dims[d] != dims[d])
			return 0;
	return 1;
}

/* ---- the walk ------------------------------------------------------------------ */

/* Value v, just defined by node n (NULL: the graph's input), against
 * every expectation on it. */
static kiln_status expect_val(const struct onnx_val *v, const Onnx__NodeProto *n,
			      const struct kiln_onnx_expect *exp, size_t n_exp)
{
	for (size_t k = 0; k < n_exp; k++) {
		const struct kiln_onnx_expect *e = &exp[k];
		if (strcmp(e->value, v->name) || same_shape(v, e->elem_type, e->ndim, e->dims))
			continue;
		struct onnx_val want = { .dtype = e->elem_type ? e->elem_type : v->dtype,
					 .ndim = e->ndim };
		memcpy(want.dims, e->dims, sizeof want.dims);
		char got[160], w[160];
		if (!n)
			return kiln_error(KILN_EINTERNAL, "the graph's input '%s' is %s, kiln's is %s",
					  v->name, onnx_val_str(v, got, sizeof got),
					  onnx_val_str(&want, w, sizeof w));
		return kiln_error(KILN_EINTERNAL, "node '%s' (%s) of layer '%s' gives %s, kiln's output of the layer is %s",
				  n->name ? n->name : v->name, n->op_type, e->layer,
				  onnx_val_str(v, got, sizeof got), onnx_val_str(&want, w, sizeof w));
	}
	return KILN_OK;
}

/* Node n: its rule, its inputs defined, its one output new; the output
 * inferred into t and checked against exp. */
static kiln_status walk_node(struct vtab *t, const Onnx__NodeProto *n,
			     const struct kiln_onnx_expect *exp, size_t n_exp)
{
	const char *op = n->op_type ? n->op_type : "";
	const char *name = n->name && *n->name ? n->name : n->n_output ? n->output[0] : "?";
	const struct onnx_rule *r = onnx_check_rule(op);
	if (n->domain && *n->domain && strcmp(n->domain, "ai.onnx"))
		return kiln_error(KILN_EINTERNAL, "node '%s' (%s): domain '%s', not ONNX's", name, op,
				  n->domain);
	if (!r)
		return kiln_error(KILN_EINTERNAL, "node '%s': operator '%s' has no shape rule in core/onnx_check_ops.c",
				  name, op);
	if ((int)n->n_input < r->min_in || (int)n->n_input > r->max_in)
		return kiln_error(KILN_EINTERNAL, "node '%s' (%s): %zu inputs, %s takes %d to %d", name,
				  op, n->n_input, op, r->min_in, r->max_in);
	if (n->n_output != 1 || !n->output[0] || !*n->output[0])
		return kiln_error(KILN_EINTERNAL, "node '%s' (%s): %zu outputs, kiln writes one", name,
				  op, n->n_output);
	if (vtab_get(t, n->output[0]))
		return kiln_error(KILN_EINTERNAL, "node '%s' (%s): its output '%s' is already defined",
				  name, op, n->output[0]);
	const struct onnx_val **in = calloc(n->n_input + 1, sizeof *in);
	if (!in)
		return kiln_error(KILN_ENOMEM, "out of memory checking the ONNX graph");
	kiln_status st = KILN_OK;
	for (size_t k = 0; k < n->n_input && !st; k++) {
		const char *x = n->input[k];
		if (!*x && (int)k < r->min_in)
			st = kiln_error(KILN_EINTERNAL, "node '%s' (%s): input %zu is required, it is omitted",
					name, op, k);
		else if (!*x && r->max_in == ONNX_RULE_MANY) /* (the rule reads every input) */
			st = kiln_error(KILN_EINTERNAL, "node '%s' (%s): input %zu is omitted (an empty name), and none of %s's variadic inputs can be",
					name, op, k, op);
		else if (*x && !(in[k] = vtab_get(t, x)))
			st = kiln_error(KILN_EINTERNAL, "node '%s' (%s): input '%s' is used before it is defined",
					name, op, x);
	}
	struct onnx_val out = { 0 };
	if (!st && (st = r->infer(n, in, (int)n->n_input, &out)))
		st = kiln_error_wrap(st, "node '%s' (%s)", name, op);
	free(in);
	if (st)
		return st;
	out.name = n->output[0];
	const struct onnx_val *v = vtab_add(t, &out);
	if (!v)
		return kiln_error(KILN_EINTERNAL, "the ONNX check's table is full");
	return expect_val(v, n, exp, n_exp);
}

/* The graph's inputs (not initializers) defined, checked against exp. */
static kiln_status walk_inputs(struct vtab *t, const Onnx__GraphProto *g,
			       const struct kiln_onnx_expect *exp, size_t n_exp)
{
	for (size_t k = 0; k < g->n_input; k++) {
		struct onnx_val v;
		kiln_status st = info_val(g->input[k], &v);
		if (st)
			return st;
		if (vtab_get(t, v.name))
			continue; /* an initializer listed as an input too: its value */
		const struct onnx_val *d = vtab_add(t, &v);
		if (!d)
			return kiln_error(KILN_EINTERNAL, "the ONNX check's table is full");
		if ((st = expect_val(d, NULL, exp, n_exp)))
			return st;
	}
	return KILN_OK;
}

/* The graph's outputs: defined, of the type and shape they declare. */
static kiln_status walk_outputs(const struct vtab *t, const Onnx__GraphProto *g)
{
	for (size_t k = 0; k < g->n_output; k++) {
		struct onnx_val decl;
		kiln_status st = info_val(g->output[k], &decl);
		if (st)
			return st;
		const struct onnx_val *v = vtab_get(t, decl.name);
		char got[160], w[160];
		if (!v)
			return kiln_error(KILN_EINTERNAL, "the graph's output '%s' is no node's output",
					  decl.name);
		if (!same_shape(v, decl.dtype, decl.ndim, decl.dims))
			return kiln_error(KILN_EINTERNAL, "the graph's output '%s' is declared %s, its node gives %s",
					  decl.name, onnx_val_str(&decl, w, sizeof w),
					  onnx_val_str(v, got, sizeof got));
	}
	return KILN_OK;
}

static kiln_status walk_graph(const Onnx__GraphProto *g, const struct kiln_onnx_expect *exp,
			      size_t n_exp)
{
	struct vtab t;
	kiln_status st = KILN_OK;
	if (vtab_init(&t, g->n_initializer + g->n_input + g->n_node)) {
		vtab_free(&t);
		return kiln_error(KILN_ENOMEM, "out of memory checking the ONNX graph");
	}
	for (size_t k = 0; k < g->n_initializer && !st; k++) {
		struct onnx_val v;
		if (!(st = init_val(g->initializer[k], &v)) && vtab_get(&t, v.name))
			st = kiln_error(KILN_EINTERNAL, "initializer '%s' is defined twice", v.name);
		if (!st)
			vtab_add(&t, &v);
	}
	if (!st)
		st = walk_inputs(&t, g, exp, n_exp);
	for (size_t k = 0; k < g->n_node && !st; k++)
		st = walk_node(&t, g->node[k], exp, n_exp);
	for (size_t k = 0; k < n_exp && !st; k++) /* a layer's value no node wrote */
		if (!vtab_get(&t, exp[k].value))
			st = kiln_error(KILN_EINTERNAL, "layer '%s': its value '%s' is not in the graph",
					exp[k].layer, exp[k].value);
	if (!st)
		st = walk_outputs(&t, g);
	vtab_free(&t);
	return st;
}

kiln_status kiln_onnx_check(const void *buf, size_t n, const struct kiln_onnx_expect *exp,
			    size_t n_exp)
{
	Onnx__ModelProto *m = onnx__model_proto__unpack(NULL, n, buf);
	kiln_status st = KILN_OK;
	int opset = 0;
	for (size_t k = 0; m && k < m->n_opset_import; k++)
		opset |= !m->opset_import[k]->domain || !*m->opset_import[k]->domain;
	if (!m || !m->graph)
		st = kiln_error(KILN_EINTERNAL, "the packed model does not parse as an ONNX ModelProto");
	else if (!opset)
		st = kiln_error(KILN_EINTERNAL, "the model imports no opset of ONNX's default domain");
	else
		st = walk_graph(m->graph, exp, n_exp);
	if (m)
		onnx__model_proto__free_unpacked(m, NULL);
	if (st)
		st = kiln_error_wrap(st, "the exported graph fails kiln's ONNX check (a bug in core/onnx_layers.c: please report)");
	return st;
}

#endif /* KILN_HAVE_ONNX */
