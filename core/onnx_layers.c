/* core/onnx_layers.c - each kiln layer of an evaluation graph as standard
 * ONNX operators (opset 17, core/onnx_export.h), in NCHW whatever [model]
 * layout trained it: kiln's layers already compute PyTorch's functions in
 * PyTorch's layouts (a channels-last flatten or linear reads C, H, W
 * order), so the weights go out unchanged.
 *
 *   linear          Gemm (transB), after Flatten for a 4-d input; over the
 *                   last dimension of [B, T, K]: MatMul(x, Transpose(W)) + b
 *   conv            Conv (+ Add of a residual input);  batchnorm  BatchNormalization (inference mode)
 *   relu, sigmoid, tanh, leaky_relu   Relu, Sigmoid, Tanh, LeakyRelu
 *   gelu            as its formula: 0.5 x (1 + Erf(x / sqrt 2)), or the tanh
 *                   approximation (Gelu is opset 20)
 *   maxpool, avgpool, global_avgpool  MaxPool, AveragePool, GlobalAveragePool
 *   flatten         Flatten (axis 1);  add  Add
 *   concat          Concat, axis 1 (dim = 1) or the last (dim = -1)
 *   dropout         nothing (the identity in evaluation)
 *   embedding       Gather;  pos_embedding  Add of Slice(weight, 0, T)
 *   layernorm       LayerNormalization (axis -1)
 *   attention       Reshape/Transpose/Gather to q, k, v [B, H, T, D], MatMul,
 *                   Mul by the scale, Where with a causal mask, Softmax,
 *                   MatMul, back to [B, T, C]
 * Loss layers are not exported (core/onnx_export.c): the graph's output is
 * the logits, what the loss layer reads.  Any other type fails, naming the
 * layer and its config line.  Every operator used here has a shape rule in
 * core/onnx_check_ops.c, which checks each export before it is written: a
 * new operator needs its rule there, or every export using it fails.
 */
#include "build-config.h"

#ifdef KILN_HAVE_ONNX

#include "onnx_export.h"

#include "quant.h"
#include "../plugins/common/c_locale.h" /* common_strtod */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the layer's config: its [layer.X] value, else its key's default ---- */

static const char *key_str(const struct onnx_graph *g, int i, const char *key)
{
	const struct model_layer *L = &g->m->layers[i];
	const char *v = kiln_config_get(g->m->cfg, L->section, key);
	if (v)
		return v;
	for (const struct kiln_key *k = L->type->keys; k && k->name; k++)
		if (!strcmp(k->name, key))
			return k->def;
	return NULL;
}

static double key_num(const struct onnx_graph *g, int i, const char *key, double def)
{
	const char *v = key_str(g, i, key);
	return v ? common_strtod(v, NULL) : def;
}

static int key_bool(const struct onnx_graph *g, int i, const char *key)
{
	const struct model_layer *L = &g->m->layers[i];
	int b = 0;
	if (kiln_config_get(g->m->cfg, L->section, key)) {
		kiln_config_get_bool(g->m->cfg, L->section, key, &b);
		return b;
	}
	const char *v = key_str(g, i, key);
	return v && (!strcmp(v, "1") || !strcmp(v, "true") || !strcmp(v, "yes"));
}

/* `N` or `H,W` into out[2]; def when unset. */
static void key_pair(const struct onnx_graph *g, int i, const char *key, int64_t def,
		     int64_t out[2])
{
	const char *v = key_str(g, i, key);
	out[0] = out[1] = def;
	if (!v)
		return;
	char *end;
	out[0] = out[1] = strtoll(v, &end, 10);
	while (*end == ' ')
		end++;
	if (*end == ',')
		out[1] = strtoll(end + 1, NULL, 10);
}

/* ---- small pieces ----------------------------------------------------------- */

static const char *in_value(const struct onnx_graph *g, int i, int k)
{
	const int j = g->m->layers[i].in[k];
	return j < 0 ? g->input : g->value[j];
}

static const struct kiln_tensor_desc *in_desc(const struct onnx_graph *g, int i, int k)
{
	return &g->nodes[i].l.in[k];
}

/* A scalar f32 constant of layer i: "<layer>/<what>". */
static const char *scalar(struct onnx_graph *g, int i, const char *what, float v)
{
	return onnx_const_f32(g, onnx_str(g, "%s/%s", g->m->layers[i].name, what), 0, NULL, &v);
}

/* A node of op with inputs a, b writing "<layer>/<what>" (what NULL: the
 * layer's own output, named as the layer). */
static const char *op2(struct onnx_graph *g, int i, const char *op, const char *what,
		       const char *a, const char *b)
{
	const char *name = what ? onnx_str(g, "%s/%s", g->m->layers[i].name, what)
				: g->m->layers[i].name;
	const char *in[2] = { a, b };
	onnx_node(g, op, name, b ? 2 : 1, in);
	return name;
}

/* kiln's padding (both sides of H, W) as ONNX's pads (begins, then ends). */
static void pads_attr(struct onnx_graph *g, Onnx__NodeProto *n, const int64_t p[2])
{
	const int64_t pads[4] = { p[0], p[1], p[0], p[1] };
	onnx_attr_ints(g, n, "pads", 4, pads);
}

/* ---- INT8 layers (a quantized model: [layer.X] int8_scale > 0) ------------ */

static int is_int8(const struct onnx_graph *g, int i)
{
	return key_num(g, i, "int8_scale", 0) > 0;
}

/* Layer i's input v as KILN_OP_QCONV/QLINEAR quantize it: QuantizeLinear
 * with the calibrated scale "X.input_scale" (the quantized file's name;
 * u8 for an input never negative in calibration, else i8; zero point 0),
 * then DequantizeLinear. */
static const char *qdq_input(struct onnx_graph *g, int i, const char *v)
{
	const char *name = g->m->layers[i].name;
	const uint8_t zero = 0;
	const char *q = onnx_str(g, "%s/input_q", name), *dq = onnx_str(g, "%s/input_dq", name);
	const float sx = (float)key_num(g, i, "int8_scale", 0);
	const char *in[3] = { v, onnx_const_f32(g, onnx_str(g, "%s.input_scale", name), 0, NULL, &sx),
			      onnx_const_i8(g, onnx_str(g, "%s/input_zero_point", name),
					    key_bool(g, i, "int8_unsigned"), 0, NULL, &zero) };
	onnx_node(g, "QuantizeLinear", q, 3, in);
	in[0] = q;
	onnx_node(g, "DequantizeLinear", dq, 3, in);
	return dq;
}

/* The model_param index of layer i's "weight", else -1. */
static int weight_param(const struct onnx_graph *g, int i)
{
	const struct model_layer *L = &g->m->layers[i];
	for (int k = 0; k < L->n_params; k++)
		if (!strcmp(g->nodes[i].l.params[k].suffix, "weight"))
			return L->pidx[k];
	return -1;
}

/* INT8 layer i's weight as the INT8 ops quantize it (core/quant.h: per
 * output channel, 7 bits, round half to even): an int8 initializer, its
 * scales "<name>_scale" f32[O] and a zero point of zeros, and
 * DequantizeLinear along axis 0 writing "<name>_dq".  <name> is the
 * weight's own, as the quantized file has it, written once; for a tied
 * weight whose owner is no INT8 layer (the GPT's lm_head reads the
 * embedding's f32 table, which stays as it is) the reader's alias
 * "<layer>.weight"; a tied weight whose owner is INT8 is the owner's. */
static const char *qdq_weight(struct onnx_graph *g, int i)
{
	const int p = weight_param(g, i);
	if (p < 0)
		return NULL;
	const struct model_param *mp = &g->m->params[p];
	const int own = mp->layer == i;
	if (!own && is_int8(g, mp->layer))
		return qdq_weight(g, mp->layer);
	const char *name = own ? mp->name : onnx_str(g, "%s.weight", g->m->layers[i].name);
	const char *dq = onnx_str(g, "%s_dq", name);
	if (own) {
		if (g->emitted[p]) /* read before, by the owner or a tied layer */
			return dq;
		g->emitted[p] = 1;
	}
	const int64_t O = mp->desc.dims[0], per = mp->numel / O;
	int8_t *q = onnx_alloc(g, (size_t)mp->numel), *zero = onnx_alloc(g, (size_t)O);
	float *scale = onnx_alloc(g, sizeof(float) * (size_t)O);
	if (!q || !zero || !scale)
		return dq;
	kiln_quant_weights(g->params + mp->off, O, per, q, scale);
	const char *in[3] = {
		onnx_const_i8(g, name, 0, mp->desc.ndim, mp->desc.dims, q),
		onnx_const_f32(g, onnx_str(g, "%s_scale", name), 1, &O, scale),
		onnx_const_i8(g, onnx_str(g, "%s_zero_point", name), 0, 1, &O, zero),
	};
	onnx_attr_int(g, onnx_node(g, "DequantizeLinear", dq, 3, in), "axis", 0);
	return dq;
}

const char *onnx_int8_weight(struct onnx_graph *g, int p)
{
	const int i = g->m->params[p].layer;
	return is_int8(g, i) && weight_param(g, i) == p ? qdq_weight(g, i) : NULL;
}

/* ---- the layers ------------------------------------------------------------- */

static kiln_status emit_linear(struct onnx_graph *g, int i)
{
	const struct kiln_tensor_desc *x = in_desc(g, i, 0);
	const int q = is_int8(g, i);
	const char *v = q ? qdq_input(g, i, in_value(g, i, 0)) : in_value(g, i, 0);
	const char *w = q ? qdq_weight(g, i) : onnx_param(g, i, "weight");
	const char *b = onnx_param(g, i, "bias");
	if (x->ndim == 3 || x->ndim > 4) { /* over the last dimension */
		Onnx__NodeProto *t = onnx_node(g, "Transpose",
					       onnx_str(g, "%s/weight_t", g->m->layers[i].name),
					       1, &w);
		const int64_t perm[2] = { 1, 0 };
		onnx_attr_ints(g, t, "perm", 2, perm);
		const char *y = op2(g, i, "MatMul", b ? "matmul" : NULL, v, t->output[0]);
		if (b)
			op2(g, i, "Add", NULL, y, b);
		return KILN_OK;
	}
	if (x->ndim == 4) {
		Onnx__NodeProto *f = onnx_node(g, "Flatten",
					       onnx_str(g, "%s/flat", g->m->layers[i].name), 1, &v);
		onnx_attr_int(g, f, "axis", 1);
		v = f->output[0];
	}
	const char *in[3] = { v, w, b };
	Onnx__NodeProto *n = onnx_node(g, "Gemm", g->m->layers[i].name, b ? 3 : 2, in);
	onnx_attr_int(g, n, "transB", 1);
	return KILN_OK;
}

static kiln_status emit_conv(struct onnx_graph *g, int i)
{
	const int q = is_int8(g, i);
	const char *x = q ? qdq_input(g, i, in_value(g, i, 0)) : in_value(g, i, 0);
	const char *w = q ? qdq_weight(g, i) : onnx_param(g, i, "weight");
	const char *b = onnx_param(g, i, "bias");
	const char *in[3] = { x, w, b };
	/* a residual input (the folded inference graph's): Conv, then Add */
	const int res = g->m->layers[i].n_in == 2;
	const char *name = res ? onnx_str(g, "%s/conv", g->m->layers[i].name) : g->m->layers[i].name;
	Onnx__NodeProto *n = onnx_node(g, "Conv", name, b ? 3 : 2, in);
	if (res)
		op2(g, i, "Add", NULL, n->output[0], in_value(g, i, 1));
	int64_t k[2], stride[2], pad[2], dil[2];
	key_pair(g, i, "kernel", 1, k);
	key_pair(g, i, "stride", 1, stride);
	key_pair(g, i, "padding", 0, pad);
	key_pair(g, i, "dilation", 1, dil);
	onnx_attr_ints(g, n, "kernel_shape", 2, k);
	onnx_attr_ints(g, n, "strides", 2, stride);
	onnx_attr_ints(g, n, "dilations", 2, dil);
	pads_attr(g, n, pad);
	onnx_attr_int(g, n, "group", (int64_t)key_num(g, i, "groups", 1));
	return KILN_OK;
}

/* The layer's `suffix` parameter, else a constant of C copies of v (a
 * batchnorm or layernorm without its affine weights). */
static const char *param_or(struct onnx_graph *g, int i, const char *suffix, int64_t C, float v)
{
	const char *p = onnx_param(g, i, suffix);
	if (p)
		return p;
	float *ones = onnx_alloc(g, sizeof(float) * (size_t)(C > 0 ? C : 1));
	for (int64_t c = 0; ones && c < C; c++)
		ones[c] = v;
	return onnx_const_f32(g, onnx_str(g, "%s/%s", g->m->layers[i].name, suffix), 1, &C, ones);
}

static kiln_status emit_batchnorm(struct onnx_graph *g, int i)
{
	const int64_t C = in_desc(g, i, 0)->dims[1];
	const char *in[5] = { in_value(g, i, 0), param_or(g, i, "weight", C, 1),
			      param_or(g, i, "bias", C, 0), onnx_param(g, i, "running_mean"),
			      onnx_param(g, i, "running_var") };
	if (!in[3] || !in[4])
		return kiln_error(KILN_ECONFIG, "%s: layer '%s' (batchnorm): no running statistics to export",
				  kiln_config_where(g->m->cfg, g->m->layers[i].section, "type"),
				  g->m->layers[i].name);
	Onnx__NodeProto *n = onnx_node(g, "BatchNormalization", g->m->layers[i].name, 5, in);
	onnx_attr_float(g, n, "epsilon", (float)key_num(g, i, "eps", 1e-5));
	return KILN_OK;
}

static kiln_status emit_pool(struct onnx_graph *g, int i, int avg)
{
	const char *x = in_value(g, i, 0);
	Onnx__NodeProto *n =
		onnx_node(g, avg ? "AveragePool" : "MaxPool", g->m->layers[i].name, 1, &x);
	int64_t k[2], stride[2], pad[2];
	key_pair(g, i, "kernel", 1, k);
	key_pair(g, i, "stride", 0, stride);
	if (!key_str(g, i, "stride"))
		stride[0] = k[0], stride[1] = k[1]; /* PyTorch: stride = kernel */
	key_pair(g, i, "padding", 0, pad);
	onnx_attr_ints(g, n, "kernel_shape", 2, k);
	onnx_attr_ints(g, n, "strides", 2, stride);
	pads_attr(g, n, pad);
	if (avg)
		onnx_attr_int(g, n, "count_include_pad", key_bool(g, i, "count_include_pad"));
	return KILN_OK;
}

static kiln_status emit_gelu(struct onnx_graph *g, int i)
{
	const char *x = in_value(g, i, 0), *t;
	const char *approx = key_str(g, i, "approximate");
	if (approx && !strcmp(approx, "tanh")) {
		/* 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
		t = op2(g, i, "Mul", "x2", x, x);
		t = op2(g, i, "Mul", "x3", t, x);
		t = op2(g, i, "Mul", "cx3", t, scalar(g, i, "c", 0.044715f));
		t = op2(g, i, "Add", "inner", x, t);
		t = op2(g, i, "Mul", "scaled", t, scalar(g, i, "k", (float)sqrt(2.0 / M_PI)));
		t = op2(g, i, "Tanh", "tanh", t, NULL);
	} else { /* 0.5 x (1 + erf(x / sqrt 2)) */
		t = op2(g, i, "Mul", "scaled", x, scalar(g, i, "k", (float)M_SQRT1_2));
		t = op2(g, i, "Erf", "erf", t, NULL);
	}
	t = op2(g, i, "Add", "one_plus", t, scalar(g, i, "one", 1.0f));
	t = op2(g, i, "Mul", "x_times", x, t);
	op2(g, i, "Mul", NULL, t, scalar(g, i, "half", 0.5f));
	return KILN_OK;
}

static kiln_status emit_add(struct onnx_graph *g, int i)
{
	const int n = g->m->layers[i].n_in;
	const char *acc = in_value(g, i, 0);
	for (int k = 1; k < n; k++) /* ((x0 + x1) + x2) ..., kiln's order */
		acc = op2(g, i, "Add", k + 1 < n ? onnx_str(g, "sum%d", k) : NULL, acc,
			  in_value(g, i, k));
	if (n == 1)
		op2(g, i, "Identity", NULL, acc, NULL);
	return KILN_OK;
}

static kiln_status emit_concat(struct onnx_graph *g, int i)
{
	const int n = g->m->layers[i].n_in;
	const char *in[KILN_LAYER_MAX_INPUTS];
	for (int k = 0; k < n; k++)
		in[k] = in_value(g, i, k);
	/* dim = -1 is the last of kiln's dims, which list N, C, H, W whatever
	 * [model] layout, as the exported graph's NCHW does: axis ndim - 1 (3
	 * of [N, C, H, W], 2 of [B, T, H]); dim = 1 is the channels */
	const int64_t axis = key_num(g, i, "dim", 1) < 0 ? in_desc(g, i, 0)->ndim - 1 : 1;
	onnx_attr_int(g, onnx_node(g, "Concat", g->m->layers[i].name, n, in), "axis", axis);
	return KILN_OK;
}

static kiln_status emit_pos_embedding(struct onnx_graph *g, int i)
{
	const int64_t T = in_desc(g, i, 0)->dims[1], one = 1;
	const int64_t zero = 0;
	const char *name = g->m->layers[i].name;
	const char *in[4] = { onnx_param(g, i, "weight"),
			      onnx_const_i64(g, onnx_str(g, "%s/start", name), 1, &one, &zero),
			      onnx_const_i64(g, onnx_str(g, "%s/end", name), 1, &one, &T),
			      onnx_const_i64(g, onnx_str(g, "%s/axis", name), 1, &one, &zero) };
	const char *rows = onnx_str(g, "%s/rows", name);
	onnx_node(g, "Slice", rows, 4, in);
	op2(g, i, "Add", NULL, in_value(g, i, 0), rows);
	return KILN_OK;
}

static kiln_status emit_layernorm(struct onnx_graph *g, int i)
{
	const struct kiln_tensor_desc *x = in_desc(g, i, 0);
	const int64_t C = x->dims[x->ndim - 1];
	const char *in[3] = { in_value(g, i, 0), param_or(g, i, "weight", C, 1),
			      onnx_param(g, i, "bias") };
	Onnx__NodeProto *n = onnx_node(g, "LayerNormalization", g->m->layers[i].name,
				       in[2] ? 3 : 2, in);
	onnx_attr_int(g, n, "axis", -1);
	onnx_attr_float(g, n, "epsilon", (float)key_num(g, i, "eps", 1e-5));
	return KILN_OK;
}

/* Layer i's Transpose of v by perm[n] into "<layer>/<what>". */
static const char *transpose(struct onnx_graph *g, int i, const char *what, const char *v,
			     int n, const int64_t *perm)
{
	Onnx__NodeProto *t = onnx_node(g, "Transpose", onnx_str(g, "%s/%s", g->m->layers[i].name,
							      what), 1, &v);
	onnx_attr_ints(g, t, "perm", n, perm);
	return t->output[0];
}

/* q, k or v (which 0, 1, 2) of [3, B, H, T, D] as [B, H, T, D]. */
static const char *pick(struct onnx_graph *g, int i, const char *qkv, int which)
{
	static const char *const names[] = { "q", "k", "v" };
	const int64_t idx = which;
	const char *in[2] = { qkv, onnx_const_i64(g, onnx_str(g, "%s/%s_index", g->m->layers[i].name,
							      names[which]), 0, NULL, &idx) };
	const char *out = onnx_str(g, "%s/%s", g->m->layers[i].name, names[which]);
	onnx_attr_int(g, onnx_node(g, "Gather", out, 2, in), "axis", 0);
	return out;
}

static kiln_status emit_attention(struct onnx_graph *g, int i)
{
	const struct kiln_tensor_desc *x = in_desc(g, i, 0);
	const char *name = g->m->layers[i].name;
	const int64_t T = x->dims[1], C = x->dims[2] / 3, H = (int64_t)key_num(g, i, "heads", 1);
	const int64_t D = C / H, four = 5, three = 3;
	double scale = key_num(g, i, "scale", 0);
	if (!(scale > 0))
		scale = 1.0 / sqrt((double)D);
	/* [B, T, 3C] -> [B, T, 3, H, D] -> [3, B, H, T, D] */
	const int64_t split[5] = { 0, T, 3, H, D }, merge[3] = { 0, T, C };
	const char *s = op2(g, i, "Reshape", "heads", in_value(g, i, 0),
			    onnx_const_i64(g, onnx_str(g, "%s/heads_shape", name), 1, &four, split));
	s = transpose(g, i, "qkv", s, 5, (const int64_t[]){ 2, 0, 3, 1, 4 });
	const char *q = pick(g, i, s, 0), *k = pick(g, i, s, 1), *v = pick(g, i, s, 2);
	const char *kt = transpose(g, i, "k_t", k, 4, (const int64_t[]){ 0, 1, 3, 2 });
	const char *sc = op2(g, i, "MatMul", "qk", q, kt);
	sc = op2(g, i, "Mul", "scores", sc, scalar(g, i, "scale", (float)scale));
	if (key_bool(g, i, "causal")) {
		uint8_t *mask = onnx_alloc(g, (size_t)(T * T));
		for (int64_t r = 0; mask && r < T; r++)
			for (int64_t c = 0; c <= r; c++)
				mask[r * T + c] = 1;
		const int64_t dims[2] = { T, T };
		const char *in[3] = { onnx_const_bool(g, onnx_str(g, "%s/causal_mask", name), 2, dims,
						      mask),
				      sc, scalar(g, i, "masked", -INFINITY) };
		sc = onnx_str(g, "%s/masked_scores", name);
		onnx_node(g, "Where", sc, 3, in);
	}
	const char *p = onnx_str(g, "%s/probs", name);
	onnx_attr_int(g, onnx_node(g, "Softmax", p, 1, &sc), "axis", -1);
	const char *y = op2(g, i, "MatMul", "context", p, v);
	y = transpose(g, i, "context_t", y, 4, (const int64_t[]){ 0, 2, 1, 3 });
	op2(g, i, "Reshape", NULL, y,
	    onnx_const_i64(g, onnx_str(g, "%s/out_shape", name), 1, &three, merge));
	return KILN_OK;
}

/* The one-node layers: kiln's type, ONNX's op. */
static const struct {
	const char *type, *op;
} unary[] = {
	{ "relu", "Relu" },       { "sigmoid", "Sigmoid" }, { "tanh", "Tanh" },
	{ "leaky_relu", "LeakyRelu" }, { "global_avgpool", "GlobalAveragePool" },
	{ "flatten", "Flatten" },
};

static kiln_status emit_unary(struct onnx_graph *g, int i)
{
	const char *type = g->m->layers[i].type->name, *x = in_value(g, i, 0);
	size_t u = 0;
	while (strcmp(type, unary[u].type))
		u++;
	Onnx__NodeProto *n = onnx_node(g, unary[u].op, g->m->layers[i].name, 1, &x);
	if (!strcmp(type, "leaky_relu"))
		onnx_attr_float(g, n, "alpha", (float)key_num(g, i, "negative_slope", 0.01));
	if (!strcmp(type, "flatten"))
		onnx_attr_int(g, n, "axis", 1);
	return KILN_OK;
}

/* The identity in evaluation: its readers read its input. */
static kiln_status emit_dropout(struct onnx_graph *g, int i)
{
	g->value[i] = in_value(g, i, 0);
	return KILN_OK;
}

static kiln_status emit_embedding(struct onnx_graph *g, int i)
{
	const char *in[2] = { onnx_param(g, i, "weight"), in_value(g, i, 0) };
	onnx_attr_int(g, onnx_node(g, "Gather", g->m->layers[i].name, 2, in), "axis", 0);
	return KILN_OK;
}

static kiln_status emit_maxpool(struct onnx_graph *g, int i)
{
	return emit_pool(g, i, 0);
}

static kiln_status emit_avgpool(struct onnx_graph *g, int i)
{
	return emit_pool(g, i, 1);
}

/* Every layer type that has a mapping, and its emitter. */
static const struct {
	const char *type;
	kiln_status (*emit)(struct onnx_graph *g, int i);
} mappings[] = {
	{ "relu", emit_unary },        { "sigmoid", emit_unary },
	{ "tanh", emit_unary },        { "leaky_relu", emit_unary },
	{ "global_avgpool", emit_unary }, { "flatten", emit_unary },
	{ "dropout", emit_dropout },   { "embedding", emit_embedding },
	{ "linear", emit_linear },     { "conv", emit_conv },
	{ "batchnorm", emit_batchnorm }, { "maxpool", emit_maxpool },
	{ "avgpool", emit_avgpool },   { "gelu", emit_gelu },
	{ "add", emit_add },           { "concat", emit_concat },
	{ "pos_embedding", emit_pos_embedding }, { "layernorm", emit_layernorm },
	{ "attention", emit_attention },
};

kiln_status onnx_emit_layer(struct onnx_graph *g, int i)
{
	const struct model_layer *L = &g->m->layers[i];
	g->value[i] = L->name;
	for (size_t k = 0; k < sizeof mappings / sizeof mappings[0]; k++)
		if (!strcmp(L->type->name, mappings[k].type))
			return mappings[k].emit(g, i);
	return kiln_error(KILN_ECONFIG, "%s: layer '%s' (type %s) has no ONNX mapping: kiln export --onnx cannot write it",
			  kiln_config_where(g->m->cfg, L->section, "type"), L->name, L->type->name);
}

#endif /* KILN_HAVE_ONNX */
