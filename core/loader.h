/* core/loader.h - the loader engine: worker threads that assemble batches
 * ahead of the training step into a ring of page-locked staging buffers.
 *
 * The order of samples is fixed per epoch by the caller (a permutation of
 * global sample indices); batch b holds order[b*batch ..].  Workers claim
 * batches in order and fill whole batches, so a batch's bytes depend only
 * on the order, never on which worker filled it or when: results are the
 * same for any worker count.  A slot is refilled only after the device copy
 * out of it has completed (an event the consumer records).
 *
 * The consumer-fill rule: on a device of host memory whose compute
 * threads take every CPU (a worker has no CPU of its own and each of its
 * wake-ups preempts a compute thread), the loader watches batches 4..20
 * handed out after a kiln_loader_start: when a worker's fill cost at most
 * 10% of the median time between two batches in CPU and never blocked (a
 * resident data set: idx, records in the page cache, cache = ram),
 * kiln_loader_next fills the batches itself, on the consumer's thread,
 * with the same bytes (the same read of the same order), and the workers
 * sleep.  Its fills are measured the same way over each 16 batches after,
 * and the workers take over again, for good, when one blocked or they cost
 * more than that share.  The fill counts as data wait
 * (kiln_loader_wait_s).  docs/data.md, "How a batch is made", Workers.
 */
#ifndef KILN_LOADER_H
#define KILN_LOADER_H

#include "data.h"

struct kiln_loader;

/* `workers` >= 1 threads, `prefetch` >= 1 batches ahead, reading data set
 * `d` (kiln_dataset_read_rows, each worker with its own scratch).
 * Staging buffers hold `max_rows` samples. */
kiln_status kiln_loader_open(struct kiln_device *dev, struct kiln_dataset *d, int64_t max_rows,
			     int workers, int prefetch, struct kiln_loader **out);

/* Start epoch `epoch` over order[0..n) in batches of `batch` rows (the last
 * batch may be shorter when keep_last; else it is dropped).  The previous
 * epoch must have been consumed completely.  `order` stays borrowed until
 * the epoch's last batch was taken. */
kiln_status kiln_loader_start(struct kiln_loader *L, int64_t epoch, const int64_t *order,
			      int64_t n, int64_t batch, int keep_last);

/* Wait for the next batch: host pointers to its samples and i32 labels,
 * and its row count.  After enqueueing the copies out of it (or the ops
 * that read it in place, on a device of host memory), the caller calls
 * kiln_loader_release() with the stream they are on: an event recorded
 * there after them frees the slot for a worker.  A
 * worker's failure (unreadable sample, bad label) is returned here with the
 * worker's message. */
kiln_status kiln_loader_next(struct kiln_loader *L, const void **x, const int32_t **y,
			     int64_t *rows, int *slot);
kiln_status kiln_loader_release(struct kiln_loader *L, int slot, void *stream);

/* Seconds the consumer spent waiting in kiln_loader_next (data wait). */
double kiln_loader_wait_s(const struct kiln_loader *L);

/* Bad samples replaced (on_error = skip) in the batches kiln_loader_next
 * has handed out, over every epoch: d->skipped without the batches the
 * workers read ahead, so a checkpoint's count is the one a run resumed
 * from it reaches again.  The consumer's thread. */
int64_t kiln_loader_skipped(const struct kiln_loader *L);

/* The most workers = auto may choose: the largest power of two at most
 * the CPUs this thread may run on (its affinity mask) and at most 32.
 * kiln_loader_probe tries no more; `kiln memory` counts the staging of
 * this many (core/memory.c). */
int kiln_loader_auto_max(void);

/* workers = auto: time a few batches of `d` with 1, 2, 4, ... workers (up
 * to kiln_loader_auto_max), stopping when doubling gains under 5%, and
 * return the best count in *best (logged).  The batches are read and
 * discarded, and the bad samples they replaced neither logged nor
 * counted: d->skipped is as before the probe. */
kiln_status kiln_loader_probe(struct kiln_device *dev, struct kiln_dataset *d, int64_t B,
			      int prefetch, void *copy_stream, int *best);

/* What the loader did, for tests and the debug log.  The consumer's thread
 * (the counts are read under the loader's lock). */
struct kiln_loader_stats {
	int64_t taken;        /* batches kiln_loader_next handed out */
	int64_t worker_fills; /* batches the workers filled */
	int64_t inline_fills; /* batches kiln_loader_next filled itself */
	int64_t wakeups;      /* the workers' returns from a wait for work */
	int64_t inline_from;  /* the batch handed out when the rule chose the
			       * consumer (0: it did not) */
	int64_t workers_from; /* the batch handed out when it went back to
			       * the workers (0: it did not) */
	double fill_cpu_s;    /* the workers' CPU time in their fills */
	double inline_cpu_s;  /* the training thread's CPU time in its fills */
	double rule_fill_s;   /* the rule's window: a fill's CPU time, */
	double rule_gap_s;    /* and the median time between two batches (0:
			       * not run); the last window's */
};
void kiln_loader_stats(struct kiln_loader *L, struct kiln_loader_stats *out);

/* The stats in one debug line, `what` naming the loader ("train"). */
void kiln_loader_log_stats(struct kiln_loader *L, const char *what);

/* Stop the workers (waiting for the batch each is filling) and free. */
void kiln_loader_close(struct kiln_loader *L);

#endif
