/* core/layers/global_avgpool.c - mean over H and W: [N, C, H, W] ->
 * [N, C, 1, 1] (PyTorch's nn.AdaptiveAvgPool2d(1)); see pool.c. */
#include "pool.h"

static kiln_status gap_configure(const struct kiln_host *h, struct kiln_layer *l,
				 const struct kiln_config *cfg, const char *sec)
{
	return pool_configure(h, l, cfg, sec, KILN_POOL_AVG, 1);
}

static const struct kiln_layer_ops gap_ops = POOL_OPS(gap_configure);

LAYER_DESCRIPTOR(kiln_layer_global_avgpool, "global_avgpool",
		 "mean over height and width: [N, C, H, W] -> [N, C, 1, 1]", gap_ops, NULL);
