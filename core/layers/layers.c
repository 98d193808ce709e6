/* core/layers/layers.c - the table of built-in layer types.  Each entry is
 * the descriptor its file defines, the same shape a layer plugin returns. */
#include "../internal.h"

extern const struct kiln_plugin kiln_layer_linear, kiln_layer_relu, kiln_layer_flatten,
	kiln_layer_softmax_xent;

const struct kiln_plugin *const kiln_builtin_layers[] = {
	&kiln_layer_linear,
	&kiln_layer_relu,
	&kiln_layer_flatten,
	&kiln_layer_softmax_xent,
	NULL
};
