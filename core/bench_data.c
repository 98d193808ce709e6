/* core/bench_data.c - `kiln bench data`: the loader alone, as training
 * drives it (workers, staging ring, copies), with no model. */
#include "data.h"
#include "loader.h"
#include "run_config.h"

#include <stdio.h>
#include <time.h>

/* Take n batches from L as training does (each copied to xd on stream
 * copy), an epoch's shuffled order (*ep, counted on) per start, at most
 * d's epoch a start.  Each start asks for no more than its share of the
 * n, so the loader holds nothing prefetched once they are taken. */
static kiln_status take_batches(struct kiln_loader *L, struct kiln_device *dev,
				const struct kiln_dataset *d, int64_t B, int64_t *order, void *xd,
				void *copy, int64_t *ep, int64_t n)
{
	const int64_t per_epoch = d->len / B;
	kiln_status st;
	for (int64_t taken = 0; taken < n; ++*ep) {
		const int64_t nb = per_epoch < n - taken ? per_epoch : n - taken;
		kiln_rng_permutation(d->seed, (uint64_t)*ep, order, d->len);
		if ((st = kiln_loader_start(L, *ep, order, nb * B, B, 0)))
			return st;
		for (int64_t b = 0; b < nb; b++, taken++) {
			const void *x;
			const int32_t *y;
			int64_t rows;
			int slot;
			if ((st = kiln_loader_next(L, &x, &y, &rows, &slot)) ||
			    (st = kiln_device_copy_async(dev, xd, x, (size_t)rows * d->sample_bytes,
							 KILN_COPY_H2D, copy)) ||
			    (st = kiln_loader_release(L, slot, copy)))
				return st;
		}
	}
	return KILN_OK;
}

kiln_status kiln_bench_data(const struct kiln_config *cfg, const struct kiln_registry *reg,
			    int64_t batches, struct kiln_data_bench *out)
{
	if (!cfg || !reg || !out)
		return kiln_null_arg("kiln_bench_data", !cfg ? "cfg" : !reg ? "reg" : "out");
	struct kiln_device *dev = NULL;
	struct kiln_dataset d;
	struct kiln_loader *L = NULL;
	void *copy = NULL, *xd = NULL;
	int64_t *order = NULL, B = 0, prefetch, ep = 0;
	int workers;
	struct kiln_run_cfg run;
	struct kiln_train_cfg tc;
	struct kiln_data_cfg data;
	kiln_status st;

	memset(out, 0, sizeof *out);
	memset(&d, 0, sizeof d);
	if ((st = kiln_run_cfg_read(cfg, &run)) || (st = kiln_train_cfg_fill(cfg, NULL, &tc)) ||
	    (st = kiln_data_cfg_read(cfg, &data)) ||
	    (st = kiln_train_cfg_batch(cfg, &tc, "the loader runs", &B)))
		return st;
	prefetch = data.prefetch;
	workers = data.workers;
	if ((st = kiln_device_open(reg, cfg, run.device, 0, &dev)) ||
	    (st = kiln_device_stream_create(dev, &copy)) ||
	    (st = kiln_dataset_open(cfg, reg, "data", "train", 1, &d)))
		goto out;
	d.timed = 1; /* the breakdown below */
	if (d.len < B) {
		st = kiln_error(KILN_ECONFIG, "[train] batch = %lld is larger than the %lld samples",
				(long long)B, (long long)d.len);
		goto out;
	}
	if (workers < 0 && (st = kiln_loader_probe(dev, &d, B, (int)prefetch, copy, &workers)))
		goto out;
	if (workers == 0)
		workers = 1; /* the bench measures the threaded loader */
	int64_t per_epoch = d.len / B;
	if (batches <= 0)
		batches = per_epoch;
	const int64_t warm = 2;
	size_t xbytes = (size_t)B * d.sample_bytes;
	if (!(order = malloc(sizeof(int64_t) * (size_t)d.len))) {
		st = kiln_error(KILN_ENOMEM, "out of memory");
		goto out;
	}
	if ((st = kiln_device_alloc(dev, xbytes, &xd)) ||
	    (st = kiln_loader_open(dev, &d, B, workers, (int)prefetch, &L)))
		goto out;

	/* the warm-up (threads started, caches filled) is a start of its own,
	 * taken completely before the clock starts: the timed window then
	 * covers exactly the batches the loader reads in it.  (Before session
	 * 29 the clock started with the workers + prefetch batches already
	 * read ahead: --batches 2 reported up to 100x the rate and read and
	 * transform times of 0.) */
	if ((st = take_batches(L, dev, &d, B, order, xd, copy, &ep, warm)) ||
	    (st = kiln_device_stream_sync(dev, copy)))
		goto out;
	const double t0 = kiln_now_s(), wait0 = kiln_loader_wait_s(L);
	const int64_t read0 = atomic_load(&d.read_ns), xf0 = atomic_load(&d.xform_ns);
	if ((st = take_batches(L, dev, &d, B, order, xd, copy, &ep, batches)) ||
	    (st = kiln_device_stream_sync(dev, copy)))
		goto out;
	out->wall_s = kiln_now_s() - t0;
	out->workers = workers;
	out->batch = B;
	out->batches = batches;
	out->samples = batches * B;
	out->sample_bytes = (int64_t)d.sample_bytes;
	out->samples_per_s = (double)out->samples / out->wall_s;
	out->mb_per_s = (double)out->samples * (double)d.sample_bytes / out->wall_s / 1e6;
	/* thread time over the samples read in the timed window: those */
	double n = (double)out->samples;
	out->read_us = (double)(atomic_load(&d.read_ns) - read0) / 1e3 / n;
	out->xform_us = (double)(atomic_load(&d.xform_ns) - xf0) / 1e3 / n;
	out->wait_frac = (kiln_loader_wait_s(L) - wait0) / out->wall_s;
	out->skipped = atomic_load(&d.skipped);

	/* the copy alone: a few synchronous batch copies out of staging */
	{
		void *h = NULL;
		if ((st = kiln_device_host_alloc(dev, xbytes, &h)))
			goto out;
		memset(h, 0, xbytes);
		double c0 = kiln_now_s();
		for (int i = 0; i < 8 && !st; i++)
			if (!(st = kiln_device_copy_async(dev, xd, h, xbytes, KILN_COPY_H2D, copy)))
				st = kiln_device_stream_sync(dev, copy);
		out->copy_us = (kiln_now_s() - c0) / 8 * 1e6;
		kiln_device_host_free(dev, h);
	}
out:
	kiln_loader_close(L);
	if (dev) {
		if (copy)
			kiln_device_stream_sync(dev, copy);
		kiln_device_free(dev, xd);
		kiln_device_stream_destroy(dev, copy);
	}
	kiln_dataset_close(&d);
	kiln_device_close(dev);
	free(order);
	return st;
}
