/* core/layers/global_avgpool.c - mean over H and W: [N, C, H, W] ->
 * [N, C, 1, 1] (PyTorch's nn.AdaptiveAvgPool2d(1)); see pool.c. */
#include "pool.h"

POOL_LAYER(global_avgpool, "global_avgpool", KILN_POOL_AVG, 1,
	   "mean over height and width: [N, C, H, W] -> [N, C, 1, 1]", NULL);
