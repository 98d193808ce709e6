/* core/layers/pool.h - what maxpool.c, avgpool.c and global_avgpool.c share:
 * one implementation of 2-d pooling, parametrised by kind. */
#ifndef KILN_LAYERS_POOL_H
#define KILN_LAYERS_POOL_H

#include "util.h"

struct pool {
	struct layer_plans plans;
	int kind;       /* KILN_POOL_MAX or KILN_POOL_AVG */
	int global;     /* kernel = the whole input */
	int64_t k[2], stride[2], pad[2];
	int include_pad;
	struct kiln_tensor_desc x, y;
	void *fwd, *infer, *bwd, *acc;
	size_t dx_bytes;
	/* the ReLU fold (kiln_layer_relu_fold 2): dy * (y > 0) into the
	 * workspace's first `front` bytes before the backward; NULL without */
	void *mask;
	size_t front;
	/* the fold done by the device in the forward's aux (POOL with
	 * KILN_OPF_ACT, ABI 2.16): no mask, no kept y */
	int folded;
};

kiln_status pool_configure(const struct kiln_host *h, struct kiln_layer *l,
			   const struct kiln_config *cfg, const char *sec, int kind, int global);
FAMILY_PASSES(pool);

/* A pooling layer kiln_layer_<var> of `kind` (global: the kernel is the
 * whole input). */
#define POOL_LAYER(var, nm, kind, global, summary, keys)                                   \
	FAMILY_LAYER(var, nm, summary, keys, pool, kind, global)

/* The window keys maxpool and avgpool share (kernel, stride), rows of
 * their key tables. */
#define POOL_WINDOW_KEYS                                                                   \
	{ "kernel", KILN_KEY_INTS, NULL, 1, 1e6, NULL, "Window: `2` or `H,W` (required)." }, \
	{ "stride", KILN_KEY_INTS, NULL, 1, 1e6, NULL, "Stride: `N` or `H,W`; default: the kernel." }

#endif
