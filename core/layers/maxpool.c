/* core/layers/maxpool.c - max pooling (PyTorch's nn.MaxPool2d); see pool.c. */
#include "pool.h"

static const struct kiln_key maxpool_keys[] = {
	{ "kernel", KILN_KEY_INTS, NULL, 1, 1e6, NULL, "Window: `2` or `H,W` (required)." },
	{ "stride", KILN_KEY_INTS, NULL, 1, 1e6, NULL, "Stride: `N` or `H,W`; default: the kernel." },
	{ "padding", KILN_KEY_INTS, "0", 0, 1e6, NULL, "Implicit -inf padding on both sides." },
	{ NULL, 0, NULL, 0, 0, NULL, NULL }
};

static kiln_status maxpool_configure(const struct kiln_host *h, struct kiln_layer *l,
				     const struct kiln_config *cfg, const char *sec)
{
	return pool_configure(h, l, cfg, sec, KILN_POOL_MAX, 0);
}

static const struct kiln_layer_ops maxpool_ops = POOL_OPS(maxpool_configure);

LAYER_DESCRIPTOR(kiln_layer_maxpool, "maxpool", "2-d max pooling (PyTorch nn.MaxPool2d)",
		 maxpool_ops, maxpool_keys);
