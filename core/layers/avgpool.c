/* core/layers/avgpool.c - average pooling (PyTorch's nn.AvgPool2d); see pool.c. */
#include "pool.h"

static const struct kiln_key avgpool_keys[] = {
	POOL_WINDOW_KEYS,
	{ "padding", KILN_KEY_INTS, "0", 0, 1e6, NULL, "Zero padding on both sides: at most half the kernel (as PyTorch)." },
	{ "count_include_pad", KILN_KEY_BOOL, "1", 0, 0, NULL,
	  "Count padded zeros in the divisor (PyTorch's default)." },
	{ NULL, 0, NULL, 0, 0, NULL, NULL }
};

POOL_LAYER(avgpool, "avgpool", KILN_POOL_AVG, 0, "2-d average pooling (PyTorch nn.AvgPool2d)",
	   avgpool_keys);
