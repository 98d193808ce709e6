/* plugins/common/describe.h - tensor and op descriptions for messages,
 * one copy for the core (kiln_tensor_desc_str, core/opcheck.c) and both
 * devices (plugins only get the host table, so they cannot call libkiln).
 * Header-only: static inline, C and C++ (nvcc), no allocation, never fails.
 *
 *   f32[64, 3, 32, 32] nhwc       a tensor (" nhwc": a 4-d channels-last one)
 *   in0 f32[64, 10], out0 f32[64]  an op's tensors
 */
#ifndef KILN_COMMON_DESCRIBE_H
#define KILN_COMMON_DESCRIBE_H

#include <kiln/plugin.h> /* struct kiln_tensor_desc, struct kiln_op */

#include <stdint.h>
#include <stdio.h> /* snprintf */

/* "f32", "bf16", ...; "?" outside the enum */
static inline const char *common_dtype_name(int dtype)
{
	/* in the order of enum kiln_dtype (no designators: nvcc reads this as C++) */
	static const char *const names[KILN_DTYPE_COUNT] = { "f32", "bf16", "f16", "i8",
							     "u8",  "i32",  "i64" };
	return dtype >= 0 && dtype < KILN_DTYPE_COUNT ? names[dtype] : "?";
}

/* Bytes per element of a dtype (0 outside the enum): kiln_dtype_size's
 * table, which a plugin cannot call (it does not link libkiln: loaded by a
 * libkiln that was itself dlopen()ed RTLD_LOCAL, as Python's ctypes does,
 * a plugin referencing it failed with "undefined symbol"; session 36). */
static inline size_t common_dtype_size(int dtype)
{
	/* in the order of enum kiln_dtype */
	static const unsigned char sizes[KILN_DTYPE_COUNT] = { 4, 2, 2, 1, 1, 4, 8 };
	return dtype >= 0 && dtype < KILN_DTYPE_COUNT ? sizes[dtype] : 0;
}

/* Elements of d: the product of its dims (1 for a scalar). */
static inline int64_t common_numel(const struct kiln_tensor_desc *d)
{
	int64_t n = 1;
	for (int i = 0; i < d->ndim && i < KILN_MAX_DIMS; i++)
		n *= d->dims[i];
	return n;
}

/* The stored innermost extent: channels for a 4-d NHWC activation. */
static inline int64_t common_inner(const struct kiln_tensor_desc *d)
{
	if (d->ndim <= 0)
		return 1;
	if (d->ndim == 4 && d->layout == KILN_NHWC)
		return d->dims[1];
	return d->dims[d->ndim - 1];
}

/* d as "f32[64, 10]" into buf (n bytes, truncated); returns buf. */
static inline char *common_desc_str(const struct kiln_tensor_desc *d, char *buf, size_t n)
{
	size_t off = 0;
	if (!n)
		return buf;
	buf[0] = 0;
	int w = snprintf(buf, n, "%s[", common_dtype_name(d->dtype));
	off = w > 0 ? (size_t)w : 0;
	for (int i = 0; i < d->ndim && i < KILN_MAX_DIMS && off < n; i++) {
		w = snprintf(buf + off, n - off, i ? ", %lld" : "%lld", (long long)d->dims[i]);
		off += w > 0 ? (size_t)w : 0;
	}
	if (off < n)
		snprintf(buf + off, n - off, "]%s", d->layout == KILN_NHWC ? " nhwc" : "");
	return buf;
}

/* op's tensors as "in0 f32[64, 10], out0 f32[64]" into list (n bytes,
 * truncated); returns list, or "no tensors" when the op has none. */
static inline const char *common_op_tensors(const struct kiln_op *op, char *list, size_t n)
{
	char one[96];
	size_t off = 0;
	if (n)
		list[0] = 0;
	for (int k = 0; k < 2; k++) {
		const int count = k ? op->n_out : op->n_in;
		const int max = k ? KILN_OP_MAX_OUT : KILN_OP_MAX_IN;
		for (int i = 0; i < count && i < max && off < n; i++) {
			common_desc_str(k ? &op->out[i] : &op->in[i], one, sizeof one);
			int w = snprintf(list + off, n - off, "%s%s%d %s", off ? ", " : "",
					 k ? "out" : "in", i, one);
			off += w > 0 ? (size_t)w : 0;
		}
	}
	return off ? list : "no tensors";
}

#endif /* KILN_COMMON_DESCRIBE_H */
