/* core/layers/avgpool.c - average pooling (PyTorch's nn.AvgPool2d); see pool.c. */
#include "pool.h"

static const struct kiln_key avgpool_keys[] = {
	{ "kernel", KILN_KEY_INTS, NULL, 1, 1e6, NULL, "Window: `2` or `H,W` (required)." },
	{ "stride", KILN_KEY_INTS, NULL, 1, 1e6, NULL, "Stride: `N` or `H,W`; default: the kernel." },
	{ "padding", KILN_KEY_INTS, "0", 0, 1e6, NULL, "Zero padding on both sides." },
	{ "count_include_pad", KILN_KEY_BOOL, "1", 0, 0, NULL,
	  "Count padded zeros in the divisor (PyTorch's default)." },
	{ NULL, 0, NULL, 0, 0, NULL, NULL }
};

static kiln_status avgpool_configure(const struct kiln_host *h, struct kiln_layer *l,
				     const struct kiln_config *cfg, const char *sec)
{
	return pool_configure(h, l, cfg, sec, KILN_POOL_AVG, 0);
}

static const struct kiln_layer_ops avgpool_ops = POOL_OPS(avgpool_configure);

LAYER_DESCRIPTOR(kiln_layer_avgpool, "avgpool", "2-d average pooling (PyTorch nn.AvgPool2d)",
		 avgpool_ops, avgpool_keys);
