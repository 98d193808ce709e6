/* core/layers/bn_sync.h - batchnorm's training path across ranks
 * ([dist] sync_bn: kiln_layer.sync_ranks > 1), used by batchnorm.c. */
#ifndef KILN_LAYERS_BN_SYNC_H
#define KILN_LAYERS_BN_SYNC_H

#include "util.h"

struct bn_sync;

/* Prepare BN_STATS, BN_APPLY (twice: with momentum and, for a
 * recomputed forward, without), BN_BWD_REDUCE and BN_BWD_APPLY for x
 * (C channels) over l->sync_ranks ranks.  The layer's workspace gains
 * the sync buffers at byte `off` (64-aligned) and the ops' own
 * workspace after them: *ws is the whole size needed. */
kiln_status bn_sync_plan(const struct kiln_host *h, struct kiln_layer *l, struct kiln_device *dev,
			 const struct kiln_tensor_desc *x, double eps, double momentum, size_t off,
			 struct bn_sync **out, size_t *ws);
/* The training forward: this rank's statistics, allgathered, merged. */
kiln_status bn_sync_forward(const struct kiln_host *h, struct bn_sync *s,
			    const struct kiln_layer_run *r);
/* The backward: dgamma and dbeta of this rank's batch into dg, db; dx
 * (when r->dx[0]) from the sums allreduced over the ranks, added into
 * dx through acc (a SCALE-accumulate plan) when accum. */
kiln_status bn_sync_backward(const struct kiln_host *h, struct bn_sync *s,
			     const struct kiln_layer_run *r, void *dg, void *db, void *dx,
			     int accum, void *acc);
/* Free s (NULL: nothing); the plans bn_sync_plan prepared are recorded in
 * the layer's plan list and freed with the layer (layer_destroy). */
void bn_sync_free(struct bn_sync *s);

#endif
