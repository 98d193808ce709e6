/* core/tensor.c - tensor descriptor helpers. */
#include "internal.h"
#include "../plugins/common/describe.h" /* common_desc_str: the devices' format too */

#include <stdio.h>
#include <string.h>

/* the plugins' tables (plugins/common/describe.h), kept once: a plugin
 * cannot call these (it does not link libkiln) */
size_t kiln_dtype_size(int dtype)
{
	return common_dtype_size(dtype);
}

const char *kiln_dtype_name(int dtype)
{
	return common_dtype_name(dtype);
}

int kiln_tensor_size(const struct kiln_tensor_desc *d, int64_t *numel, size_t *bytes)
{
	int64_t n = 1;
	uint64_t b;
	int bad = d->ndim < 0 || d->ndim > KILN_MAX_DIMS;
	for (int i = 0; !bad && i < d->ndim; i++)
		bad = d->dims[i] < 0 || __builtin_mul_overflow(n, d->dims[i], &n);
	bad = bad || __builtin_mul_overflow((uint64_t)n, (uint64_t)kiln_dtype_size(d->dtype), &b) ||
	      b > KILN_TENSOR_MAX_BYTES;
	if (numel)
		*numel = bad ? INT64_MAX : n;
	if (bytes)
		*bytes = bad ? SIZE_MAX : (size_t)b;
	return bad;
}

int64_t kiln_tensor_numel(const struct kiln_tensor_desc *d)
{
	int64_t n;
	kiln_tensor_size(d, &n, NULL);
	return n;
}

size_t kiln_tensor_bytes(const struct kiln_tensor_desc *d)
{
	size_t b;
	kiln_tensor_size(d, NULL, &b);
	return b;
}

void kiln_tensor_desc_init(struct kiln_tensor_desc *d, int dtype, int ndim,
			   const int64_t *dims)
{
	memset(d, 0, sizeof *d);
	d->dtype = dtype;
	d->layout = KILN_ROW;
	d->ndim = ndim < 0 ? 0 : ndim > KILN_MAX_DIMS ? KILN_MAX_DIMS : ndim;
	for (int i = 0; i < d->ndim; i++)
		d->dims[i] = dims[i];
}

char *kiln_tensor_desc_str(const struct kiln_tensor_desc *d, char *buf, size_t n)
{
	return common_desc_str(d, buf, n);
}
