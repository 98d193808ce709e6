/* core/dist.h - the data-parallel engine inside libkiln (core/dist.c).
 *
 * One per training run when the run has more than one rank (or names a
 * communicator).  It joins the group (store + rendezvous + comm plugin),
 * broadcasts rank 0's training state, and during backward allreduces the
 * gradients in buckets on its own comm stream, each bucket as soon as the
 * backward of the last layer that writes into it has been enqueued. */
#ifndef KILN_CORE_DIST_H
#define KILN_CORE_DIST_H

#include "graph.h"
#include <kiln/dist.h>

struct kiln_dist;

/* Join the group the environment describes with [run] comm.  *out = NULL
 * (and KILN_OK) for a single process without a named communicator. */
kiln_status kiln_dist_open(const struct kiln_config *cfg, const struct kiln_registry *reg,
			   struct kiln_device *dev, struct kiln_dist **out);
/* Wait for every rank (store barrier), leave the group, free. NULL: no-op. */
void kiln_dist_close(struct kiln_dist *d);
int kiln_dist_rank(const struct kiln_dist *d);  /* 0 for NULL */
int kiln_dist_world(const struct kiln_dist *d); /* 1 for NULL */

/* Set up the buckets over m's trainable gradients and hook m's backward.
 * `compute` is the stream backward runs on. */
kiln_status kiln_dist_attach(struct kiln_dist *d, struct kiln_model *m, void *compute);
/* Copy rank 0's training state (every kiln_model_state_buffers entry) to
 * all ranks; waits for it. */
kiln_status kiln_dist_broadcast_state(struct kiln_dist *d, void *compute);
/* Whether the coming backward is the one whose gradients are final (the
 * last micro-step, without accumulation): buckets then start during it. */
void kiln_dist_overlap_next(struct kiln_dist *d, int on);
/* After the last micro-step's backward (and accumulation's add and mean):
 * start the buckets that have not started, and make `compute` wait for all
 * of them before the optimizer. */
kiln_status kiln_dist_finish_grads(struct kiln_dist *d, void *compute);
/* Sum v[0..n) over the ranks (host values; a sync point: log only). */
kiln_status kiln_dist_sum_host(struct kiln_dist *d, double *v, int n, void *compute);
/* A failed step: when the failure looks like a lost peer, say which rank
 * was lost (asking the store), keeping st. */
kiln_status kiln_dist_explain(struct kiln_dist *d, kiln_status st);

/* host->device_host_fn (core/device.c) and host->fatal. */
kiln_status kiln_device_host_fn(struct kiln_device *dev, void *stream, kiln_status (*fn)(void *),
				void *arg);
void kiln_host_fatal(const char *who, const char *fmt, ...) KILN_PRINTF(2, 3);

#endif
