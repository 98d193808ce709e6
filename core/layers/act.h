/* core/layers/act.h - what the activation layers (leaky_relu.c, gelu.c,
 * sigmoid.c, tanh.c) share: one elementwise implementation by kind. */
#ifndef KILN_LAYERS_ACT_H
#define KILN_LAYERS_ACT_H

#include "util.h"

kiln_status act_configure(const struct kiln_host *h, struct kiln_layer *l,
			  const struct kiln_config *cfg, const char *sec, int kind);
FAMILY_PASSES(act);

#define ACT_LAYER(var, nm, kind, summary, keys) FAMILY_LAYER(var, nm, summary, keys, act, kind)

#endif
