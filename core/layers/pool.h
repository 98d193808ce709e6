/* core/layers/pool.h - what maxpool.c, avgpool.c and global_avgpool.c share:
 * one implementation of 2-d pooling, parametrised by kind. */
#ifndef KILN_LAYERS_POOL_H
#define KILN_LAYERS_POOL_H

#include "util.h"

struct pool {
	int kind;       /* KILN_POOL_MAX or KILN_POOL_AVG */
	int global;     /* kernel = the whole input */
	int64_t k[2], stride[2], pad[2];
	int include_pad;
	struct kiln_tensor_desc x, y;
	void *fwd, *infer, *bwd, *acc;
	size_t dx_bytes;
};

kiln_status pool_configure(const struct kiln_host *h, struct kiln_layer *l,
			   const struct kiln_config *cfg, const char *sec, int kind, int global);
kiln_status pool_infer(const struct kiln_host *h, struct kiln_layer *l);
kiln_status pool_plan(const struct kiln_host *h, struct kiln_layer *l, struct kiln_device *dev,
		      size_t *ws);
kiln_status pool_forward(const struct kiln_host *h, struct kiln_layer *l,
			 const struct kiln_layer_run *r);
kiln_status pool_backward(const struct kiln_host *h, struct kiln_layer *l,
			  const struct kiln_layer_run *r);
void pool_destroy(const struct kiln_host *h, struct kiln_layer *l, struct kiln_device *dev);

#define POOL_OPS(configure_fn)                                                            \
	{                                                                                 \
		.version = KILN_LAYER_OPS_VERSION, .min_inputs = 1, .max_inputs = 1,      \
		.configure = configure_fn, .infer = pool_infer, .plan = pool_plan,        \
		.forward = pool_forward, .backward = pool_backward,                       \
		.destroy = pool_destroy,                                                  \
	}

#endif
