/* core/layers/layers.c - the table of built-in layer types.  Each entry is
 * the descriptor its file defines, the same shape a layer plugin returns. */
#include "../internal.h"

const struct kiln_plugin *const kiln_builtin_layers[] = {
	NULL
};
