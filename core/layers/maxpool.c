/* core/layers/maxpool.c - max pooling (PyTorch's nn.MaxPool2d); see pool.c. */
#include "pool.h"

static const struct kiln_key maxpool_keys[] = {
	POOL_WINDOW_KEYS,
	{ "padding", KILN_KEY_INTS, "0", 0, 1e6, NULL, "Implicit -inf padding on both sides: at most half the kernel (as PyTorch)." },
	{ NULL, 0, NULL, 0, 0, NULL, NULL }
};

POOL_LAYER(maxpool, "maxpool", KILN_POOL_MAX, 0, "2-d max pooling (PyTorch nn.MaxPool2d)",
	   maxpool_keys);
