/* core/layers/layers.c - the table of built-in layer types.  Each entry is
 * the descriptor its file defines, the same shape a layer plugin returns. */
#include "../internal.h"

extern const struct kiln_plugin kiln_layer_linear, kiln_layer_relu, kiln_layer_flatten,
	kiln_layer_softmax_xent, kiln_layer_conv, kiln_layer_batchnorm, kiln_layer_maxpool,
	kiln_layer_avgpool, kiln_layer_global_avgpool, kiln_layer_dropout, kiln_layer_add,
	kiln_layer_concat, kiln_layer_leaky_relu, kiln_layer_gelu, kiln_layer_sigmoid,
	kiln_layer_tanh, kiln_layer_mse, kiln_layer_bce_logits;
extern const struct kiln_plugin kiln_layer_embedding, kiln_layer_pos_embedding,
	kiln_layer_layernorm;
extern const struct kiln_plugin kiln_layer_attention;
extern const struct kiln_plugin kiln_layer_lstm, kiln_layer_gru;

const struct kiln_plugin *const kiln_builtin_layers[] = {
	&kiln_layer_linear,
	&kiln_layer_conv,
	&kiln_layer_batchnorm,
	&kiln_layer_maxpool,
	&kiln_layer_avgpool,
	&kiln_layer_global_avgpool,
	&kiln_layer_dropout,
	&kiln_layer_add,
	&kiln_layer_concat,
	&kiln_layer_flatten,
	&kiln_layer_relu,
	&kiln_layer_leaky_relu,
	&kiln_layer_gelu,
	&kiln_layer_sigmoid,
	&kiln_layer_tanh,
	&kiln_layer_softmax_xent,
	&kiln_layer_mse,
	&kiln_layer_bce_logits,
	&kiln_layer_embedding,
	&kiln_layer_pos_embedding,
	&kiln_layer_layernorm,
	&kiln_layer_attention,
	&kiln_layer_lstm,
	&kiln_layer_gru,
	NULL
};
