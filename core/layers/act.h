/* core/layers/act.h - what the activation layers (leaky_relu.c, gelu.c,
 * sigmoid.c, tanh.c) share: one elementwise implementation by kind. */
#ifndef KILN_LAYERS_ACT_H
#define KILN_LAYERS_ACT_H

#include "util.h"

kiln_status act_configure(const struct kiln_host *h, struct kiln_layer *l,
			  const struct kiln_config *cfg, const char *sec, int kind);
kiln_status act_infer(const struct kiln_host *h, struct kiln_layer *l);
kiln_status act_plan(const struct kiln_host *h, struct kiln_layer *l, struct kiln_device *dev,
		     size_t *ws);
kiln_status act_forward(const struct kiln_host *h, struct kiln_layer *l,
			const struct kiln_layer_run *r);
kiln_status act_backward(const struct kiln_host *h, struct kiln_layer *l,
			 const struct kiln_layer_run *r);
void act_destroy(const struct kiln_host *h, struct kiln_layer *l, struct kiln_device *dev);

#define ACT_LAYER(var, nm, kind, summary, keys)                                           \
	static kiln_status var##_configure(const struct kiln_host *h, struct kiln_layer *l, \
					   const struct kiln_config *cfg, const char *sec)  \
	{                                                                                 \
		return act_configure(h, l, cfg, sec, kind);                               \
	}                                                                                 \
	static const struct kiln_layer_ops var##_ops = {                                  \
		.version = KILN_LAYER_OPS_VERSION, .min_inputs = 1, .max_inputs = 1,      \
		.configure = var##_configure, .infer = act_infer, .plan = act_plan,       \
		.forward = act_forward, .backward = act_backward,                         \
		.destroy = act_destroy,                                                   \
	};                                                                                \
	LAYER_DESCRIPTOR(kiln_layer_##var, nm, summary, var##_ops, keys)

#endif
