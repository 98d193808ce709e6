/* core/layers/util.h - small helpers shared by the built-in layer files. */
#ifndef KILN_LAYERS_UTIL_H
#define KILN_LAYERS_UTIL_H

#include "../internal.h"

static inline void op_init(struct kiln_op *op, int type, int n_in, int n_out)
{
	memset(op, 0, sizeof *op);
	op->type = type;
	op->n_in = n_in;
	op->n_out = n_out;
}

/* f32 row-major descriptor of up to 3 dims (0 ends the list). */
static inline void f32_desc(struct kiln_tensor_desc *d, int64_t a, int64_t b, int64_t c)
{
	int64_t dims[3] = { a, b, c };
	int n = a ? b ? c ? 3 : 2 : 1 : 0;
	kiln_tensor_desc_init(d, KILN_F32, n, dims);
}

/* Elements per sample: product of dims 1.. */
static inline int64_t per_sample(const struct kiln_tensor_desc *d)
{
	int64_t n = 1;
	for (int i = 1; i < d->ndim; i++)
		n *= d->dims[i];
	return n;
}

/* Prepare `op` into *plan, growing *ws to the largest workspace seen. */
static inline kiln_status prep(const struct kiln_host *h, struct kiln_device *dev,
			       const struct kiln_op *op, void **plan, size_t *ws)
{
	size_t w = 0;
	kiln_status st = h->device_prepare(dev, op, plan, &w);
	if (!st && w > *ws)
		*ws = w;
	return st;
}

static inline void args_ws(struct kiln_op_args *a, const struct kiln_layer_run *r)
{
	a->workspace = r->workspace;
	a->workspace_bytes = r->workspace_bytes;
}

#define LAYER_DESCRIPTOR(var, nm, sum, opsv, keysv)                                       \
	const struct kiln_plugin var = {                                                  \
		.abi_major = KILN_ABI_MAJOR, .abi_minor = KILN_ABI_MINOR,                 \
		.kind = KILN_PLUGIN_LAYER, .name = nm, .summary = sum, .ops = &opsv,      \
		.keys = keysv, .probe = NULL,                                             \
	}

#endif
