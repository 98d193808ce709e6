/* core/loader.h - the loader engine: worker threads that assemble batches
 * ahead of the training step into a ring of page-locked staging buffers.
 *
 * The order of samples is fixed per epoch by the caller (a permutation of
 * global sample indices); batch b holds order[b*batch ..].  Workers claim
 * batches in order and fill whole batches, so a batch's bytes depend only
 * on the order, never on which worker filled it or when: results are the
 * same for any worker count.  A slot is refilled only after the device copy
 * out of it has completed (an event the consumer records).
 */
#ifndef KILN_LOADER_H
#define KILN_LOADER_H

#include "internal.h"

struct kiln_loader;

/* `workers` >= 1 threads, `prefetch` >= 1 batches ahead.  read() of the
 * source is called from the worker threads (it is thread-safe by the
 * source contract).  Staging buffers hold `max_rows` samples. */
kiln_status kiln_loader_open(struct kiln_device *dev, const struct kiln_source_ops *ops,
			     void *src, const char *section, int64_t classes,
			     size_t sample_bytes, int64_t max_rows, int workers, int prefetch,
			     struct kiln_loader **out);

/* Start an epoch over order[0..n) in batches of `batch` rows (the last
 * batch may be shorter when keep_last; else it is dropped).  The previous
 * epoch must have been consumed completely.  `order` stays borrowed until
 * the epoch's last batch was taken. */
kiln_status kiln_loader_start(struct kiln_loader *L, const int64_t *order, int64_t n,
			      int64_t batch, int keep_last);

/* Wait for the next batch: host pointers to its samples and i32 labels,
 * and its row count.  After enqueueing the copies out of it, the caller
 * calls kiln_loader_release() with an event recorded after them.  A
 * worker's failure (unreadable sample, bad label) is returned here with the
 * worker's message. */
kiln_status kiln_loader_next(struct kiln_loader *L, const void **x, const int32_t **y,
			     int64_t *rows, int *slot);
kiln_status kiln_loader_release(struct kiln_loader *L, int slot, void *copy_stream);

/* Read samples idx[0..rows) into x (rows * sample_bytes) and their labels
 * into y, checking each label is a class in [0, classes).  What a worker
 * does for one batch, and what the trainer does itself without workers. */
kiln_status kiln_loader_read_rows(const struct kiln_source_ops *ops, void *src,
				  const char *section, int64_t classes, const int64_t *idx,
				  int64_t rows, size_t sample_bytes, void *x, int32_t *y);

/* Stop the workers (waiting for the batch each is filling) and free. */
void kiln_loader_close(struct kiln_loader *L);

#endif
