/* core/layers/leaky_relu.c - y = x > 0 ? x : negative_slope * x. */
#include "act.h"

static const struct kiln_key leaky_keys[] = {
	{ "negative_slope", KILN_KEY_FLOAT, "0.01", -1e6, 1e6, NULL, "Slope for x < 0." },
	{ NULL, 0, NULL, 0, 0, NULL, NULL }
};

ACT_LAYER(leaky_relu, "leaky_relu", KILN_ACT_LEAKY_RELU,
	  "leaky ReLU: y = x > 0 ? x : negative_slope * x", leaky_keys);
