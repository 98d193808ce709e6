/* core/onnx_check_ops.c - ONNX's shape inference (opset 17) for the
 * operators core/onnx_layers.c emits, for kiln's check of an export
 * (core/onnx_check.h).  Each rule takes the node's inputs' types and
 * shapes (all dimensions known: the batch is 1), checks what ONNX's
 * operator schema requires of them (dtypes, ranks, a weight's shape
 * against its input: Conv's channels, Gemm's inner dimension, a
 * BatchNormalization's statistics, Concat's other axes, Reshape's element
 * count), and gives the output's.  Data is read only for the constant
 * operands shapes depend on: Reshape's shape, Slice's starts, ends, axes
 * and steps, a Gather's constant indices (kept in range).  An operator
 * kiln emits without a rule here fails the check: add its rule.
 */
#include "build-config.h"

#ifdef KILN_HAVE_ONNX

#include "onnx_check.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

enum {
	F32 = ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT,
	U8 = ONNX__TENSOR_PROTO__DATA_TYPE__UINT8,
	I8 = ONNX__TENSOR_PROTO__DATA_TYPE__INT8,
	I32 = ONNX__TENSOR_PROTO__DATA_TYPE__INT32,
	I64 = ONNX__TENSOR_PROTO__DATA_TYPE__INT64,
	BOOL = ONNX__TENSOR_PROTO__DATA_TYPE__BOOL,
};

#define BAD(...) kiln_error(KILN_EINTERNAL, __VA_ARGS__)

/* ---- attributes ---------------------------------------------------------------- */

static const Onnx__AttributeProto *attr(const Onnx__NodeProto *n, const char *name)
{
	for (size_t k = 0; k < n->n_attribute; k++)
		if (n->attribute[k]->name && !strcmp(n->attribute[k]->name, name))
			return n->attribute[k];
	return NULL;
}

static int64_t attr_i(const Onnx__NodeProto *n, const char *name, int64_t def)
{
	const Onnx__AttributeProto *a = attr(n, name);
	return a && a->type == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT ? a->i : def;
}

/* An INTS attribute into v[max]: its count, 0 when absent, -1 when it
 * has more than max values. */
static int attr_ints(const Onnx__NodeProto *n, const char *name, int64_t *v, int max)
{
	const Onnx__AttributeProto *a = attr(n, name);
	if (!a || a->type != ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS)
		return 0;
	if (a->n_ints > (size_t)max)
		return -1;
	memcpy(v, a->ints, sizeof *v * a->n_ints);
	return (int)a->n_ints;
}

/* An axis attribute in [-r, r) (or [-r, r] when `past`) as 0..r. */
static kiln_status axis_of(const Onnx__NodeProto *n, const char *name, int64_t def, int r,
			   int past, int64_t *axis)
{
	int64_t a = attr_i(n, name, def);
	if (a < -r || a >= r + past)
		return BAD("%s = %lld is out of range for rank %d", name, (long long)a, r);
	*axis = a < 0 ? a + r : a;
	return KILN_OK;
}

/* ---- types and shapes ------------------------------------------------------------ */

static const char *shape_str(const struct onnx_val *v, char *buf, size_t n)
{
	return onnx_val_str(v, buf, n);
}

/* v's dtype is one of the 0-ended list. */
static kiln_status dtype_in(const struct onnx_val *v, const char *what, ...)
{
	va_list ap;
	va_start(ap, what);
	for (int d = va_arg(ap, int); d; d = va_arg(ap, int))
		if (v->dtype == d) {
			va_end(ap);
			return KILN_OK;
		}
	va_end(ap);
	char s[160];
	return BAD("%s '%s' is %s: not a type the operator takes there", what, v->name,
		   shape_str(v, s, sizeof s));
}

static kiln_status rank_in(const struct onnx_val *v, const char *what, int lo, int hi)
{
	char s[160];
	if (v->ndim < lo || v->ndim > hi)
		return BAD("%s '%s' is %s: rank %d, the operator takes %d to %d", what, v->name,
			   shape_str(v, s, sizeof s), v->ndim, lo, hi);
	return KILN_OK;
}

static void copy_shape(struct onnx_val *out, const struct onnx_val *in, int dtype)
{
	out->dtype = dtype ? dtype : in->dtype;
	out->ndim = in->ndim;
	memcpy(out->dims, in->dims, sizeof out->dims);
}

/* Checked int64 arithmetic: dimensions come from the file (a wrapped
 * product is undefined behaviour, and could make a wrong shape pass).
 * 1 when *acc op v overflowed. */
static int mul_over(int64_t *acc, int64_t v)
{
	return __builtin_mul_overflow(*acc, v, acc);
}

static int add_over(int64_t *acc, int64_t v)
{
	return __builtin_add_overflow(*acc, v, acc);
}

#define OVER(what) BAD("%s passes int64", what)

/* v's element count in *n; 1 when it passes int64. */
static int numel(const struct onnx_val *v, int64_t *n)
{
	*n = 1;
	for (int d = 0; d < v->ndim; d++)
		if (mul_over(n, v->dims[d]))
			return 1;
	return 0;
}

/* A 1-d [len] (or, scalar_ok, 0-d) parameter of dtype; what names it. */
static kiln_status vec_of(const struct onnx_val *v, const char *what, int dtype, int64_t len,
			  int scalar_ok)
{
	char s[160];
	if (v->dtype == dtype && ((v->ndim == 1 && v->dims[0] == len) || (scalar_ok && !v->ndim)))
		return KILN_OK;
	struct onnx_val want = { .dtype = dtype, .ndim = 1, .dims = { len } };
	char w[64];
	return BAD("%s '%s' is %s, the input wants %s%s", what, v->name, shape_str(v, s, sizeof s),
		   shape_str(&want, w, sizeof w), scalar_ok ? " or a scalar" : "");
}

/* Numpy's broadcast of a and b into out (multidirectional). */
static kiln_status broadcast(const struct onnx_val *a, const struct onnx_val *b,
			     struct onnx_val *out)
{
	const int r = a->ndim > b->ndim ? a->ndim : b->ndim;
	char s[160], t[160];
	out->ndim = r;
	for (int d = 0; d < r; d++) {
		const int da = d - (r - a->ndim), db = d - (r - b->ndim);
		const int64_t x = da >= 0 ? a->dims[da] : 1, y = db >= 0 ? b->dims[db] : 1;
		if (x != y && x != 1 && y != 1)
			return BAD("'%s' %s and '%s' %s do not broadcast", a->name,
				   shape_str(a, s, sizeof s), b->name, shape_str(b, t, sizeof t));
		out->dims[d] = x == 1 ? y : x;
	}
	return KILN_OK;
}

/* A constant i64 1-d operand's values into v[max]: its count. */
static kiln_status const_i64(const struct onnx_val *x, const char *what, int64_t *v, int max,
			     int *count)
{
	const Onnx__TensorProto *t = x->init;
	if (!t || x->dtype != I64 || x->ndim != 1 || x->dims[0] > max)
		return BAD("%s '%s' is not a constant i64 vector of at most %d values", what, x->name,
			   max);
	*count = (int)x->dims[0];
	if (t->has_raw_data)
		memcpy(v, t->raw_data.data, sizeof *v * (size_t)*count); /* little-endian */
	else
		memcpy(v, t->int64_data, sizeof *v * (size_t)*count);
	return KILN_OK;
}

/* ---- elementwise --------------------------------------------------------------- */

static kiln_status rule_float_unary(const Onnx__NodeProto *n, const struct onnx_val *const *in,
				    int n_in, struct onnx_val *out)
{
	(void)n, (void)n_in;
	kiln_status st = dtype_in(in[0], "input", F32, 0);
	if (!st)
		copy_shape(out, in[0], 0);
	return st;
}

static kiln_status rule_identity(const Onnx__NodeProto *n, const struct onnx_val *const *in,
				 int n_in, struct onnx_val *out)
{
	(void)n, (void)n_in;
	copy_shape(out, in[0], 0);
	return KILN_OK;
}

static kiln_status rule_binary(const Onnx__NodeProto *n, const struct onnx_val *const *in,
			       int n_in, struct onnx_val *out)
{
	(void)n, (void)n_in;
	char s[160], t[160];
	if (in[0]->dtype != in[1]->dtype)
		return BAD("'%s' is %s and '%s' is %s: one type wanted", in[0]->name,
			   shape_str(in[0], s, sizeof s), in[1]->name, shape_str(in[1], t, sizeof t));
	out->dtype = in[0]->dtype;
	return broadcast(in[0], in[1], out);
}

static kiln_status rule_where(const Onnx__NodeProto *n, const struct onnx_val *const *in,
			      int n_in, struct onnx_val *out)
{
	struct onnx_val xy = { 0 };
	kiln_status st = dtype_in(in[0], "condition", BOOL, 0);
	if (st || (st = rule_binary(n, in + 1, n_in - 1, &xy)))
		return st;
	xy.name = "x, y";
	out->dtype = xy.dtype;
	return broadcast(in[0], &xy, out);
}

/* ---- matrix products ------------------------------------------------------------- */

static kiln_status rule_gemm(const Onnx__NodeProto *n, const struct onnx_val *const *in,
			     int n_in, struct onnx_val *out)
{
	const struct onnx_val *a = in[0], *b = in[1];
	kiln_status st;
	if ((st = rank_in(a, "A", 2, 2)) || (st = rank_in(b, "B", 2, 2)) ||
	    (st = dtype_in(a, "A", F32, 0)) || (st = dtype_in(b, "B", F32, 0)))
		return st;
	const int ta = attr_i(n, "transA", 0) != 0, tb = attr_i(n, "transB", 0) != 0;
	const int64_t M = a->dims[ta], K = a->dims[!ta], K2 = b->dims[tb], N = b->dims[!tb];
	char s[160], t[160];
	if (K != K2)
		return BAD("A '%s' %s (transA %d) and B '%s' %s (transB %d): inner dimensions %lld and %lld differ",
			   a->name, shape_str(a, s, sizeof s), ta, b->name, shape_str(b, t, sizeof t),
			   tb, (long long)K, (long long)K2);
	out->dtype = F32, out->ndim = 2, out->dims[0] = M, out->dims[1] = N;
	if (n_in > 2 && in[2]) { /* C broadcast to [M, N], one way */
		struct onnx_val mn = *out, bc = { 0 };
		mn.name = "A B";
		if ((st = dtype_in(in[2], "C", F32, 0)) || (st = broadcast(&mn, in[2], &bc)))
			return st;
		if (bc.ndim != 2 || bc.dims[0] != M || bc.dims[1] != N)
			return BAD("C '%s' %s does not broadcast to [%lld, %lld]", in[2]->name,
				   shape_str(in[2], s, sizeof s), (long long)M, (long long)N);
	}
	return KILN_OK;
}

static kiln_status rule_matmul(const Onnx__NodeProto *n, const struct onnx_val *const *in,
			       int n_in, struct onnx_val *out)
{
	(void)n, (void)n_in;
	const struct onnx_val *a = in[0], *b = in[1];
	kiln_status st;
	if ((st = rank_in(a, "A", 2, ONNX_CHECK_MAX_DIMS)) ||
	    (st = rank_in(b, "B", 2, ONNX_CHECK_MAX_DIMS)) || (st = dtype_in(a, "A", F32, 0)) ||
	    (st = dtype_in(b, "B", F32, 0)))
		return st;
	char s[160], t[160];
	if (a->dims[a->ndim - 1] != b->dims[b->ndim - 2])
		return BAD("A '%s' %s and B '%s' %s: inner dimensions differ", a->name,
			   shape_str(a, s, sizeof s), b->name, shape_str(b, t, sizeof t));
	struct onnx_val ba = *a, bb = *b; /* the batch dimensions broadcast */
	ba.ndim -= 2, bb.ndim -= 2;
	if ((st = broadcast(&ba, &bb, out)))
		return st;
	out->dtype = F32;
	out->dims[out->ndim++] = a->dims[a->ndim - 2];
	out->dims[out->ndim++] = b->dims[b->ndim - 1];
	return KILN_OK;
}

/* ---- layout -------------------------------------------------------------------- */

static kiln_status rule_transpose(const Onnx__NodeProto *n, const struct onnx_val *const *in,
				  int n_in, struct onnx_val *out)
{
	(void)n_in;
	const struct onnx_val *x = in[0];
	int64_t perm[ONNX_CHECK_MAX_DIMS];
	int np = attr_ints(n, "perm", perm, ONNX_CHECK_MAX_DIMS), seen = 0;
	if (!np) /* default: reversed */
		for (np = 0; np < x->ndim; np++)
			perm[np] = x->ndim - 1 - np;
	if (np != x->ndim)
		return BAD("perm has %d values for rank %d", np, x->ndim);
	for (int d = 0; d < np; d++) {
		if (perm[d] < 0 || perm[d] >= np || (seen & (1 << perm[d])))
			return BAD("perm is not a permutation of 0..%d", np - 1);
		seen |= 1 << perm[d];
		out->dims[d] = x->dims[perm[d]];
	}
	out->dtype = x->dtype, out->ndim = np;
	return KILN_OK;
}

static kiln_status rule_flatten(const Onnx__NodeProto *n, const struct onnx_val *const *in,
				int n_in, struct onnx_val *out)
{
	(void)n_in;
	int64_t axis, lo = 1, hi = 1;
	kiln_status st = axis_of(n, "axis", 1, in[0]->ndim, 1, &axis);
	if (st)
		return st;
	for (int d = 0; d < in[0]->ndim; d++)
		if (mul_over(d < axis ? &lo : &hi, in[0]->dims[d]))
			return OVER("the product of the dimensions");
	out->dtype = in[0]->dtype, out->ndim = 2, out->dims[0] = lo, out->dims[1] = hi;
	return KILN_OK;
}

static kiln_status rule_concat(const Onnx__NodeProto *n, const struct onnx_val *const *in,
			       int n_in, struct onnx_val *out)
{
	const struct onnx_val *x = in[0];
	int64_t axis;
	if (!attr(n, "axis"))
		return BAD("no axis attribute (Concat requires one)");
	kiln_status st = axis_of(n, "axis", 0, x->ndim, 0, &axis);
	if (st)
		return st;
	copy_shape(out, x, 0);
	for (int k = 1; k < n_in; k++) {
		const struct onnx_val *y = in[k];
		char s[160], t[160];
		int ok = y->dtype == x->dtype && y->ndim == x->ndim;
		for (int d = 0; ok && d < x->ndim; d++)
			ok = d == axis || y->dims[d] == x->dims[d];
		if (!ok)
			return BAD("'%s' %s and '%s' %s differ off axis %lld", x->name,
				   shape_str(x, s, sizeof s), y->name, shape_str(y, t, sizeof t),
				   (long long)axis);
		if (add_over(&out->dims[axis], y->dims[axis]))
			return OVER("the sum of the dimensions on the axis");
	}
	return KILN_OK;
}

static kiln_status rule_reshape(const Onnx__NodeProto *n, const struct onnx_val *const *in,
				int n_in, struct onnx_val *out)
{
	(void)n_in;
	const struct onnx_val *x = in[0];
	int64_t shape[ONNX_CHECK_MAX_DIMS], known = 1;
	int r, infer = -1;
	kiln_status st = const_i64(in[1], "shape", shape, ONNX_CHECK_MAX_DIMS, &r);
	if (st)
		return st;
	const int allowzero = attr_i(n, "allowzero", 0) != 0;
	for (int d = 0; d < r; d++) {
		if (shape[d] == 0 && !allowzero) {
			if (d >= x->ndim)
				return BAD("shape[%d] = 0 copies a dimension the input has not", d);
			shape[d] = x->dims[d];
		}
		if (shape[d] == -1 && infer < 0)
			infer = d;
		else if (shape[d] < 0)
			return BAD("shape[%d] = %lld", d, (long long)shape[d]);
		else if (mul_over(&known, shape[d]))
			return OVER("the product of the shape's values");
	}
	char s[160];
	int64_t count;
	if (numel(x, &count))
		return BAD("'%s' %s: its element count passes int64", x->name,
			   shape_str(x, s, sizeof s));
	if (infer >= 0)
		shape[infer] = known ? count / known : 0;
	if (infer >= 0 ? !known || count % known : known != count)
		return BAD("'%s' %s has %lld elements, the shape asks for another count", x->name,
			   shape_str(x, s, sizeof s), (long long)count);
	out->dtype = x->dtype, out->ndim = r;
	memcpy(out->dims, shape, sizeof *shape * (size_t)r);
	return KILN_OK;
}

/* ---- indexing -------------------------------------------------------------------- */

/* ONNX's Slice of a dimension of size dim: start, end (clamped as ONNX
 * does) and step (not 0) to the count taken. */
static int64_t slice_len(int64_t dim, int64_t start, int64_t end, int64_t step)
{
	/* (the file's values: a start or end beyond +-dim clamps, so they
	 * are clamped first, and a step beyond dim takes one element, so it
	 * is too: no int64 overflow, review of session 32) */
	start = start < -dim ? -dim : start > dim ? dim : start;
	end = end < -dim - 1 ? -dim - 1 : end > dim ? dim : end;
	step = step > dim + 1 ? dim + 1 : step < -dim - 1 ? -dim - 1 : step;
	start += start < 0 ? dim : 0;
	end += end < 0 ? dim : 0;
	if (step > 0) {
		start = start < 0 ? 0 : start > dim ? dim : start;
		end = end < 0 ? 0 : end > dim ? dim : end;
		return end > start ? (end - start + step - 1) / step : 0;
	}
	start = start < 0 ? 0 : start > dim - 1 ? dim - 1 : start;
	end = end < -1 ? -1 : end > dim - 1 ? dim - 1 : end;
	return start > end ? (start - end - step - 1) / -step : 0;
}

static kiln_status rule_slice(const Onnx__NodeProto *n, const struct onnx_val *const *in,
			      int n_in, struct onnx_val *out)
{
	(void)n;
	const struct onnx_val *x = in[0];
	enum { M = ONNX_CHECK_MAX_DIMS };
	int64_t starts[M], ends[M], axes[M], steps[M];
	int ns, ne, na, nt, seen = 0;
	kiln_status st;
	if ((st = const_i64(in[1], "starts", starts, M, &ns)) ||
	    (st = const_i64(in[2], "ends", ends, M, &ne)))
		return st;
	na = nt = ns;
	for (int k = 0; k < ns; k++)
		axes[k] = k, steps[k] = 1;
	if ((n_in > 3 && in[3] && (st = const_i64(in[3], "axes", axes, M, &na))) ||
	    (n_in > 4 && in[4] && (st = const_i64(in[4], "steps", steps, M, &nt))))
		return st;
	if (ne != ns || na != ns || nt != ns)
		return BAD("starts, ends, axes and steps have %d, %d, %d and %d values", ns, ne, na,
			   nt);
	copy_shape(out, x, 0);
	for (int k = 0; k < ns; k++) {
		const int64_t a = axes[k] < 0 ? axes[k] + x->ndim : axes[k];
		if (a < 0 || a >= x->ndim || (seen & (1 << a)) || !steps[k])
			return BAD("axes[%d] = %lld (step %lld) for rank %d", k, (long long)axes[k],
				   (long long)steps[k], x->ndim);
		seen |= 1 << a;
		out->dims[a] = slice_len(x->dims[a], starts[k], ends[k], steps[k]);
	}
	return KILN_OK;
}

/* A constant index operand's values, each in [-dim, dim). */
static kiln_status indices_in_range(const struct onnx_val *ix, int64_t dim)
{
	const Onnx__TensorProto *t = ix->init;
	if (!t || !t->has_raw_data)
		return KILN_OK; /* computed: its range is the runtime's */
	int64_t count;
	if (numel(ix, &count)) /* (an initializer's count is bounded by its bytes) */
		return OVER("the index operand's element count");
	for (int64_t k = 0; k < count; k++) {
		int64_t v;
		if (ix->dtype == I64)
			memcpy(&v, t->raw_data.data + 8 * k, 8);
		else {
			int32_t w;
			memcpy(&w, t->raw_data.data + 4 * k, 4);
			v = w;
		}
		if (v < -dim || v >= dim)
			return BAD("index %lld of '%s' is out of range for a dimension of %lld",
				   (long long)v, ix->name, (long long)dim);
	}
	return KILN_OK;
}

static kiln_status rule_gather(const Onnx__NodeProto *n, const struct onnx_val *const *in,
			       int n_in, struct onnx_val *out)
{
	(void)n_in;
	const struct onnx_val *x = in[0], *ix = in[1];
	int64_t axis;
	kiln_status st;
	if ((st = rank_in(x, "data", 1, ONNX_CHECK_MAX_DIMS)) ||
	    (st = dtype_in(ix, "indices", I32, I64, 0)) ||
	    (st = axis_of(n, "axis", 0, x->ndim, 0, &axis)) ||
	    (st = indices_in_range(ix, x->dims[axis])))
		return st;
	if (x->ndim - 1 + ix->ndim > ONNX_CHECK_MAX_DIMS)
		return BAD("the output's rank passes %d", ONNX_CHECK_MAX_DIMS);
	int r = 0;
	for (int d = 0; d < axis; d++)
		out->dims[r++] = x->dims[d];
	for (int d = 0; d < ix->ndim; d++)
		out->dims[r++] = ix->dims[d];
	for (int d = (int)axis + 1; d < x->ndim; d++)
		out->dims[r++] = x->dims[d];
	out->dtype = x->dtype, out->ndim = r;
	return KILN_OK;
}

/* ---- convolution, pooling, normalisation ------------------------------------------ */

/* The spatial output sizes of a window over x (N, C, spatial...): kernel
 * k[], strides, dilations, pads (begins then ends) from the node, into
 * out->dims[2..]. */
static kiln_status window(const Onnx__NodeProto *n, const struct onnx_val *x, const int64_t *k,
			  int ceil_mode, struct onnx_val *out)
{
	enum { M = ONNX_CHECK_MAX_DIMS };
	const int sp = x->ndim - 2;
	int64_t s[M], dl[M], p[2 * M];
	const int ns = attr_ints(n, "strides", s, M), nd = attr_ints(n, "dilations", dl, M),
		  np = attr_ints(n, "pads", p, 2 * M);
	const Onnx__AttributeProto *ap = attr(n, "auto_pad");
	if (ap && ap->s.len && (ap->s.len != 6 || memcmp(ap->s.data, "NOTSET", 6)))
		return BAD("auto_pad is set: kiln writes explicit pads");
	if ((ns && ns != sp) || (nd && nd != sp) || (np && np != 2 * sp))
		return BAD("strides, dilations or pads do not match %d spatial dimensions", sp);
	for (int d = 0; d < sp; d++) {
		const int64_t st = ns ? s[d] : 1, di = nd ? dl[d] : 1, pb = np ? p[d] : 0,
			      pe = np ? p[sp + d] : 0;
		if (st < 1 || di < 1 || pb < 0 || pe < 0 || k[d] < 1)
			return BAD("spatial dimension %d: kernel %lld, stride %lld, dilation %lld, pads %lld, %lld",
				   d, (long long)k[d], (long long)st, (long long)di, (long long)pb,
				   (long long)pe);
		/* span = di * (k - 1) + 1 and the padded input, checked (the
		 * attributes are the file's); room = padded - span cannot
		 * overflow (both >= 0) */
		int64_t span = k[d] - 1, padded = x->dims[2 + d];
		if (mul_over(&span, di) || add_over(&span, 1) || add_over(&padded, pb) ||
		    add_over(&padded, pe))
			return BAD("spatial dimension %d: the window or the padded input passes int64", d);
		int64_t room = padded - span, up = room;
		if (room >= 0 && ceil_mode && add_over(&up, st - 1))
			return BAD("spatial dimension %d: the padded input passes int64", d);
		if (room < 0)
			return BAD("spatial dimension %d: the window (%lld) passes the padded input (%lld)",
				   d, (long long)span, (long long)padded);
		out->dims[2 + d] = up / st + 1;
	}
	return KILN_OK;
}

static kiln_status rule_conv(const Onnx__NodeProto *n, const struct onnx_val *const *in,
			     int n_in, struct onnx_val *out)
{
	const struct onnx_val *x = in[0], *w = in[1];
	kiln_status st;
	if ((st = rank_in(x, "X", 3, ONNX_CHECK_MAX_DIMS)) || (st = dtype_in(x, "X", F32, 0)) ||
	    (st = dtype_in(w, "W", F32, 0)))
		return st;
	const int64_t group = attr_i(n, "group", 1), M = w->dims[0];
	int64_t k[ONNX_CHECK_MAX_DIMS], cin = w->dims[1];
	const int nk = attr_ints(n, "kernel_shape", k, ONNX_CHECK_MAX_DIMS);
	char s[160], t[160];
	if (w->ndim != x->ndim || group < 1 || mul_over(&cin, group) || x->dims[1] != cin ||
	    M % group)
		return BAD("W '%s' %s does not fit X '%s' %s with group %lld", w->name,
			   shape_str(w, s, sizeof s), x->name, shape_str(x, t, sizeof t),
			   (long long)group);
	for (int d = 0; d < x->ndim - 2; d++)
		if (nk && (nk != x->ndim - 2 || k[d] != w->dims[2 + d]))
			return BAD("kernel_shape differs from W '%s' %s", w->name,
				   shape_str(w, s, sizeof s));
	if (n_in > 2 && in[2] && (st = vec_of(in[2], "B", F32, M, 0)))
		return st;
	copy_shape(out, x, F32);
	out->dims[1] = M;
	return window(n, x, w->dims + 2, 0, out);
}

static kiln_status rule_pool(const Onnx__NodeProto *n, const struct onnx_val *const *in,
			     int n_in, struct onnx_val *out)
{
	(void)n_in;
	const struct onnx_val *x = in[0];
	kiln_status st;
	if ((st = rank_in(x, "X", 3, ONNX_CHECK_MAX_DIMS)) || (st = dtype_in(x, "X", F32, 0)))
		return st;
	int64_t k[ONNX_CHECK_MAX_DIMS], p[2 * ONNX_CHECK_MAX_DIMS];
	const int sp = x->ndim - 2, np = attr_ints(n, "pads", p, 2 * ONNX_CHECK_MAX_DIMS);
	if (attr_ints(n, "kernel_shape", k, ONNX_CHECK_MAX_DIMS) != sp)
		return BAD("kernel_shape has no value per spatial dimension (%d)", sp);
	for (int d = 0; d < np; d++) /* ONNX Runtime refuses a pad of a kernel or more */
		if (np == 2 * sp && p[d] >= k[d % sp])
			return BAD("pads[%d] = %lld is not smaller than the kernel (%lld)", d,
				   (long long)p[d], (long long)k[d % sp]);
	copy_shape(out, x, 0);
	return window(n, x, k, attr_i(n, "ceil_mode", 0) != 0, out);
}

static kiln_status rule_global_pool(const Onnx__NodeProto *n, const struct onnx_val *const *in,
				    int n_in, struct onnx_val *out)
{
	(void)n, (void)n_in;
	kiln_status st;
	if ((st = rank_in(in[0], "X", 3, ONNX_CHECK_MAX_DIMS)) ||
	    (st = dtype_in(in[0], "X", F32, 0)))
		return st;
	copy_shape(out, in[0], 0);
	for (int d = 2; d < out->ndim; d++)
		out->dims[d] = 1;
	return KILN_OK;
}

static kiln_status rule_batchnorm(const Onnx__NodeProto *n, const struct onnx_val *const *in,
				  int n_in, struct onnx_val *out)
{
	(void)n_in;
	static const char *const what[5] = { "X", "scale", "B", "input_mean", "input_var" };
	const struct onnx_val *x = in[0];
	kiln_status st;
	if ((st = rank_in(x, "X", 2, ONNX_CHECK_MAX_DIMS)) || (st = dtype_in(x, "X", F32, 0)))
		return st;
	if (attr_i(n, "training_mode", 0))
		return BAD("training_mode is set: an exported graph evaluates");
	for (int k = 1; k < 5; k++) /* each [C], as the running statistics */
		if ((st = vec_of(in[k], what[k], F32, x->dims[1], 0)))
			return st;
	copy_shape(out, x, 0);
	return KILN_OK;
}

static kiln_status rule_layernorm(const Onnx__NodeProto *n, const struct onnx_val *const *in,
				  int n_in, struct onnx_val *out)
{
	const struct onnx_val *x = in[0];
	int64_t axis;
	kiln_status st;
	if ((st = dtype_in(x, "X", F32, 0)) || (st = axis_of(n, "axis", -1, x->ndim, 0, &axis)))
		return st;
	for (int k = 1; k < n_in && k < 3; k++) { /* Scale, B: the normalised shape */
		const struct onnx_val *p = in[k];
		char s[160], t[160];
		int ok = p && p->dtype == F32 && p->ndim == x->ndim - axis;
		for (int d = 0; ok && d < p->ndim; d++)
			ok = p->dims[d] == x->dims[axis + d];
		if (p && !ok)
			return BAD("%s '%s' %s is not the normalised shape of X '%s' %s from axis %lld",
				   k == 1 ? "Scale" : "B", p->name, shape_str(p, s, sizeof s), x->name,
				   shape_str(x, t, sizeof t), (long long)axis);
	}
	copy_shape(out, x, 0);
	return KILN_OK;
}

static kiln_status rule_softmax(const Onnx__NodeProto *n, const struct onnx_val *const *in,
				int n_in, struct onnx_val *out)
{
	(void)n_in;
	int64_t axis;
	kiln_status st;
	if ((st = dtype_in(in[0], "input", F32, 0)) ||
	    (st = axis_of(n, "axis", -1, in[0]->ndim, 0, &axis)))
		return st;
	copy_shape(out, in[0], 0);
	return KILN_OK;
}

/* ---- quantization ---------------------------------------------------------------- */

/* Scale and zero point of a Quantize/DequantizeLinear over x: per tensor
 * (scalars) or per channel of `axis` ([x.dims[axis]]); zp of zp_dtype
 * (0: either 8-bit type) and scale's shape. */
static kiln_status qparams(const Onnx__NodeProto *n, const struct onnx_val *x,
			   const struct onnx_val *scale, const struct onnx_val *zp, int zp_dtype)
{
	int64_t axis = 0;
	kiln_status st;
	if (scale->ndim && (st = axis_of(n, "axis", 1, x->ndim, 0, &axis)))
		return st;
	if ((st = vec_of(scale, "scale", F32, scale->ndim ? x->dims[axis] : 1, 1)))
		return st;
	if (!zp)
		return KILN_OK;
	if ((st = zp_dtype ? dtype_in(zp, "zero point", zp_dtype, 0)
			   : dtype_in(zp, "zero point", U8, I8, 0)))
		return st;
	char s[160], t[160];
	if (zp->ndim != scale->ndim || (zp->ndim && zp->dims[0] != scale->dims[0]))
		return BAD("zero point '%s' %s and scale '%s' %s differ in shape", zp->name,
			   shape_str(zp, s, sizeof s), scale->name, shape_str(scale, t, sizeof t));
	return KILN_OK;
}

static kiln_status rule_quantize(const Onnx__NodeProto *n, const struct onnx_val *const *in,
				 int n_in, struct onnx_val *out)
{
	const struct onnx_val *zp = n_in > 2 ? in[2] : NULL;
	kiln_status st;
	if ((st = dtype_in(in[0], "x", F32, 0)) || (st = qparams(n, in[0], in[1], zp, 0)))
		return st;
	copy_shape(out, in[0], zp ? zp->dtype : U8);
	return KILN_OK;
}

static kiln_status rule_dequantize(const Onnx__NodeProto *n, const struct onnx_val *const *in,
				   int n_in, struct onnx_val *out)
{
	const struct onnx_val *zp = n_in > 2 ? in[2] : NULL;
	kiln_status st;
	if ((st = dtype_in(in[0], "x", U8, I8, I32, 0)) ||
	    (st = qparams(n, in[0], in[1], zp, in[0]->dtype)))
		return st;
	copy_shape(out, in[0], F32);
	return KILN_OK;
}

/* ---- the table ---------------------------------------------------------------------- */

static const struct onnx_rule rules[] = {
	{ "Relu", 1, 1, rule_float_unary },     { "Sigmoid", 1, 1, rule_float_unary },
	{ "Tanh", 1, 1, rule_float_unary },     { "LeakyRelu", 1, 1, rule_float_unary },
	{ "Erf", 1, 1, rule_float_unary },      { "Identity", 1, 1, rule_identity },
	{ "Add", 2, 2, rule_binary },           { "Mul", 2, 2, rule_binary },
	{ "Where", 3, 3, rule_where },          { "Gemm", 2, 3, rule_gemm },
	{ "MatMul", 2, 2, rule_matmul },        { "Transpose", 1, 1, rule_transpose },
	{ "Flatten", 1, 1, rule_flatten },      { "Concat", 1, ONNX_RULE_MANY, rule_concat },
	{ "Reshape", 2, 2, rule_reshape },      { "Slice", 3, 5, rule_slice },
	{ "Gather", 2, 2, rule_gather },        { "Conv", 2, 3, rule_conv },
	{ "MaxPool", 1, 1, rule_pool },         { "AveragePool", 1, 1, rule_pool },
	{ "GlobalAveragePool", 1, 1, rule_global_pool },
	{ "BatchNormalization", 5, 5, rule_batchnorm },
	{ "LayerNormalization", 2, 3, rule_layernorm },
	{ "Softmax", 1, 1, rule_softmax },      { "QuantizeLinear", 2, 3, rule_quantize },
	{ "DequantizeLinear", 2, 3, rule_dequantize },
};

const struct onnx_rule *onnx_check_rule(const char *op)
{
	for (size_t k = 0; k < sizeof rules / sizeof rules[0]; k++)
		if (!strcmp(rules[k].op, op))
			return &rules[k];
	return NULL;
}

#endif /* KILN_HAVE_ONNX */
